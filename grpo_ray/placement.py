"""Where the pools go: one Ray placement group per node group, checked against the cluster before anything starts.

Each pool asks, per actor, for CPUs, GPUs (cuda) and optionally a custom node resource
that marks the nodes it may use (``cluster.node_resources``, e.g. ``generator:
generation`` on KubeRay worker groups started with ``resources: {"generation": 1}``).
Pools named together in ``cluster.colocate`` share one placement group: bundle i
holds actor i of each of them, and they split its GPU. Every other pool gets its
own placement group, so by default generators, learner, reference and rewards sit
on bundles of their own ("non-colocated").

``plan`` and ``problems`` are pure (recipe and node list in, numbers out) so the
fit check is tested without a cluster; ``reserve`` makes the placement groups and
gives up with a message instead of waiting forever.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from grpo_ray import schedules
from grpo_ray.config import KINDS, POOLS, ClusterConfig, Recipe
from grpo_ray.errors import UserError

MARKER = 0.001  # how much of a node-marker resource one actor takes: any node with the marker has room for many


class ClusterError(UserError):
    """The cluster cannot hold the plan."""


@dataclass
class PoolPlan:
    name: str
    actors: int
    cpus: float
    """CPUs per actor."""
    gpus: float
    """GPUs per actor (tensor parallel engines take several)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom resources per actor (node markers)."""


def plan(recipe: Recipe, pools: tuple[str, ...] = POOLS) -> dict[str, PoolPlan]:
    """What each pool asks for, from the recipe alone (pools not in `pools` ask for no actors)."""
    plans = {name: PoolPlan(name, k.count(recipe), k.cpus(recipe), k.gpus(recipe)) for name, k in KINDS.items()}
    for pool, resource in recipe.cluster.node_resources.items():
        plans[pool].resources[resource] = MARKER
    for pool in set(POOLS) - set(pools):
        plans[pool].actors = 0
    return plans


def threads(recipe: Recipe, plans: dict[str, PoolPlan], node_cpus: float) -> dict[str, int]:
    """Compute threads per actor of each pool (cluster.cpu_threads). On one CPU node with a schedule whose phases do
    not overlap (batched on-policy) the phases run one at a time, so the phase running takes the node's CPUs; reward
    actors score in Python and keep their reservation."""
    mode, c = recipe.cluster.cpu_threads, recipe.cluster
    if mode == "auto":
        alone = not schedules.of(recipe.algorithm).overlapping()  # one phase at a time
        mode = "node" if c.device == "cpu" and c.nodes == 1 and alone else "reserved"
    return {
        pool: max(1, int(node_cpus // max(1, p.actors)) if mode == "node" and KINDS[pool].model else round(p.cpus))
        for pool, p in plans.items()
    }


def node_markers(c: ClusterConfig) -> list[str]:
    """The marker each of the first nodes carries, in order: {generation: 2, training: 1} -> generation,
    generation, training (the nodes after them carry none). deploy/slurm starts its nodes this way."""
    return [marker for marker, n in c.node_markers.items() for _ in range(n)]


def node_groups(c: ClusterConfig) -> list[list[str]]:
    """Pools that share a placement group: the colocate groups, then every other pool on its own."""
    grouped = [list(g) for g in c.colocate]
    seen = {p for g in grouped for p in g}
    return grouped + [[p] for p in POOLS if p not in seen]


def bundles(group: list[str], plans: dict[str, PoolPlan]) -> list[dict[str, float]]:
    """Bundle i of a node group holds actor i of each of its pools: CPUs add up, GPUs are shared."""
    count = max(plans[p].actors for p in group)
    out = []
    for i in range(count):
        members = [plans[p] for p in group if plans[p].actors > i]
        b: dict[str, float] = {"CPU": sum(m.cpus for m in members)}
        gpus = max(m.gpus for m in members)
        if gpus:
            b["GPU"] = gpus
        for m in members:
            for k, v in m.resources.items():
                b[k] = b.get(k, 0) + v
        out.append(b)
    return out


def problems(recipe: Recipe, nodes: list[dict[str, float]], pools: tuple[str, ...] = POOLS) -> list[str]:
    """Why the alive `nodes` (their total resources) cannot hold the plan; empty when they can."""
    plans = plan(recipe, pools)
    out = []
    need: dict[str, float] = {}
    for group in node_groups(recipe.cluster):
        if max(plans[p].actors for p in group) == 0:
            continue
        for b in bundles(group, plans):
            for k, v in b.items():
                need[k] = need.get(k, 0) + v
            message = f"no node can hold one actor of {'+'.join(group)}: it asks for {_fmt(b)}"
            if message not in out and not any(all(n.get(k, 0) >= v - 1e-9 for k, v in b.items()) for n in nodes):
                out.append(message)
    for k, v in sorted(need.items()):
        have = sum(n.get(k, 0) for n in nodes)
        if have < v - 1e-9:
            out.append(f"the pools ask for {v:g} {k} in all, the cluster has {have:g}")
    return out


def local_problems(recipe: Recipe, pools: tuple[str, ...] = POOLS) -> list[str]:
    """Before start: why the local cluster a run starts (no RAY_ADDRESS: one node, this machine's cores and each
    node marker) cannot hold the recipe's pools on CPU; empty when it can, or when the run joins a cluster or uses
    GPUs (Ray counts those when it starts)."""
    if os.environ.get("RAY_ADDRESS") or recipe.cluster.device != "cpu":
        return []
    cores = float(os.cpu_count() or 1)  # what Ray counts at most (a container's quota can make it fewer)
    return problems(recipe, [{"CPU": cores, **local_markers(recipe.cluster)}], pools)


def local_markers(c: ClusterConfig) -> dict[str, float]:
    """The node markers a local cluster carries so that it stands in for every node group of the recipe."""
    return {m: 1000.0 for m in c.node_resources.values()}


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()))


def reserve(recipe: Recipe, pools: tuple[str, ...] = POOLS, timeout_s: float = 120.0) -> dict[str, tuple]:
    """Check the cluster, make one placement group per node group; pool -> (placement group, gpus per actor).

    Only `pools` are placed (a replay needs no generators)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    found = problems(recipe, nodes, pools)
    if found:
        raise ClusterError("the cluster cannot hold this recipe:\n" + "\n".join(f"  - {p}" for p in found))
    plans = plan(recipe, pools)
    out = {}
    for group in node_groups(recipe.cluster):
        if max(plans[p].actors for p in group) == 0:
            continue
        pg = placement_group(bundles(group, plans), strategy="PACK", name=f"grpo-ray-{'-'.join(group)}")
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            raise ClusterError(
                f"placement of {'+'.join(group)} not ready after {timeout_s:g}s (asked for {bundles(group, plans)})"
            ) from None
        sharing = len([p for p in group if plans[p].gpus])
        for pool in group:
            out[pool] = (pg, plans[pool].gpus / max(1, sharing) if sharing > 1 else plans[pool].gpus)
    return out


def write_placement(path: Path, pools: dict[str, list[dict]]) -> None:
    """placement.json: per pool, per actor, its node id, pid, compute threads and resources."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pools, indent=1))


# --- the layout the fit check reads: pools on the nodes the recipe describes ---------------------


@dataclass
class Node:
    index: int
    markers: tuple[str, ...]
    free: float
    """Free GPUs (CPU nodes: 0, never checked)."""
    hosts: list[tuple[str, int, float]] = field(default_factory=list)
    """(node group, actor index, GPUs) placed here."""


def layout(r: Recipe, pools: tuple[str, ...] = POOLS) -> tuple[list[Node], list[str]]:
    """Place every node group's bundles (of `pools`) on simulated nodes, first fit; problems for bundles with no
    room."""
    c = r.cluster
    markers = [(m,) for m in node_markers(r.cluster)]
    problems = []
    if len(markers) > c.nodes:
        problems.append(
            f"cluster.node_markers {dict(c.node_markers)} mark {len(markers)} nodes, but cluster.nodes is {c.nodes}"
        )
    if not markers:  # markers not described: every node may carry any of them
        markers = [tuple(sorted(set(c.node_resources.values())))] * c.nodes
    nodes = [Node(i, markers[i] if i < len(markers) else (), float(c.devices_per_node)) for i in range(c.nodes)]
    plans = plan(r, pools)
    for group in node_groups(r.cluster):
        if c.device == "cuda" and not any(plans[p].gpus for p in group):
            continue  # CPU-only pools (rewards) go wherever Ray finds CPUs; only GPUs are laid out here
        want = {k for p in group for k in plans[p].resources}
        eligible = [n for n in nodes if want <= set(n.markers)]
        if not want:
            eligible.sort(key=lambda n: bool(n.markers))  # Ray may use marked nodes too; unmarked ones first
        free = sum(n.free for n in eligible)
        group_bundles = bundles(group, plans)
        for i, b in enumerate(group_bundles):
            gpus = b.get("GPU", 0.0)
            node = next((n for n in eligible if n.free >= gpus - 1e-9), None)
            if node is None:
                where = f"nodes marked {'+'.join(sorted(want))}" if want else "the cluster's nodes"
                n = len(group_bundles)
                problems.append(
                    f"{'+'.join(group)}: {n} actors of {gpus:g} GPUs need {n * gpus:g} GPUs on {where}, which have "
                    f"{len(eligible)} nodes x {c.devices_per_node} GPUs = {len(eligible) * c.devices_per_node}, "
                    f"{free:g} of them free for it"
                    + (
                        f"; raise cluster.node_markers.{sorted(want)[0]} (and the worker group's replicas) or ask for "
                        "fewer actors"
                        if want
                        else "; add nodes, colocate pools (cluster.colocate) or ask for fewer actors"
                    )
                )
                break
            node.free -= gpus
            node.hosts.append(("+".join(p for p in group if plans[p].actors > i), i, gpus))
    return nodes, problems


def describe(nodes: list[Node], r: Recipe) -> list[str]:
    gpu = r.cluster.device == "cuda"
    lines = []
    for n in nodes:
        count = Counter(g for g, _, _ in n.hosts)
        each = {g: gpus for g, _, gpus in n.hosts}
        used = sum(gpus for _, _, gpus in n.hosts)
        what = ", ".join(f"{g} x{k}" + (f" ({each[g]:g} GPU each)" if gpu else "") for g, k in count.items())
        tag = f" [{', '.join(n.markers)}]" if n.markers and r.cluster.node_markers else ""
        room = f" {used:g}/{r.cluster.devices_per_node} GPUs:" if gpu else ":"
        lines.append(f"node {n.index}{tag}{room} {what or 'idle'}")
    for name, p in plan(r).items() if gpu else ():  # pools of CPU actors only (the rule rewards)
        if p.actors and not p.gpus:
            lines.append(f"{name} x{p.actors} ({p.cpus:g} CPU each): no GPU, on any node with free CPUs")
    return lines
