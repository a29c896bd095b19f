"""A scripted TextArena opponent (``environment.options.opponent``): takes the lowest free cell it is offered."""

import re


def lowest(observation: str, player: int) -> str:
    return min(re.findall(r"\[(\d+)\]", observation.split("Available Moves:")[-1]), key=int).join("[]")
