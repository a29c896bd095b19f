"""Multi-turn rollouts: trajectories run turn by turn on one vLLM engine, an environment answering between turns.

Token in, token out. A trajectory is its prompt's ids, then each model turn's ids as the engine sampled them, then
each observation's ids as the chat template lays out a message (``grpo_ray.data.template``), and the next turn
is generated from exactly those ids: nothing is decoded and tokenized again, so the ids the learner trains on are
the ids the engine consumed and produced. The loss mask is 1 on the model's tokens and 0 on the observations';
the sampler's logprob is kept for every model token (0.0 on the others).

The engine is never idle while a trajectory can generate: each turn is a request of its own on the engine's step
loop, and a finished turn's environment call runs on a thread (in a child process, ``grpo_ray.envs.child``)
while the engine goes on with the other trajectories; the answer's tokens go back in as the next request.

A turn ends with the model's end-of-turn token, or with one of environment.stop (a tool call's closing tag): the
template's end-of-turn token is then put after it, masked. A trajectory ends when its environment says done,
after environment.max_turns turns, when the next observation would take it past environment.max_tokens, when a
turn is cut at generator.sampling.max_tokens, or when its environment fails (raises, hangs, exits, runs out of
memory, answers garbage or floods): that trajectory alone, counted, with the reward it had so far.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
import threading
import time
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor

from grpo_ray.data import images
from grpo_ray.data.template import Observations, TemplateError
from grpo_ray.envs import jail, played, program
from grpo_ray.envs.child import EnvChild
from grpo_ray.models import vision
from grpo_ray.rewards import search_here
from grpo_ray.rollouts.engine_loop import EngineLoop
from grpo_ray.rollouts.trajectory import Trajectory, turn_params, turn_seed
from grpo_ray.types import Completion, Prompt

FAILED = {
    "timeout": "ran past environment.timeout_s",
    "died": "exited (a crash, os._exit, or killed)",
    "memory": "ran out of memory (environment.memory_mb)",
    "lost": "lost its process (another episode in it hung or exited)",
}


def done_future(value) -> Future:
    """A future already holding `value`."""
    f: Future = Future()
    f.set_result(value)
    return f


def open_prompt(prompt: Prompt, opening: str, tokenizer, recipe) -> tuple[str, str]:
    """Meet `prompt` (a row's) with its episode's opening observation: ("taken", "") where the row's prompt has
    no user turn (it ends with its system message: the task's instructions) and the opening becomes it, `prompt`
    rewritten in place as the data layer lays out a row; ("found", "") where the row's last user turn holds the
    opening's text; else ("mismatch" or "long", what is wrong)."""
    from grpo_ray.data import prompt_text

    last = prompt.messages[-1] if prompt.messages else {"role": "user", "content": prompt.text}  # (none known)
    if last.get("role") == "user":
        if " ".join(opening.split()) in " ".join(str(last.get("content", "")).split()):
            return "found", ""
        return "mismatch", (
            f"reset's opening {opening[:80]!r} is not in the row's prompt {str(last.get('content'))[:80]!r}: the "
            "model would read one task and be scored on another (OpenEnv: options.reset_key passes the row's task "
            "to reset; rows whose prompt ends with a system message take the opening as their user turn)"
        )
    d = recipe.data
    messages = [*prompt.messages, {"role": "user", "content": opening}]
    text = prompt_text(
        tokenizer, {"prompt": messages}, d.response_prefix, recipe.model.chat_template_kwargs, d.system_prompt
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > d.max_prompt_length:
        return (
            "long",
            f"reset's opening makes a prompt of {len(ids)} tokens, over data.max_prompt_length={d.max_prompt_length}",
        )
    prompt.messages, prompt.text, prompt.ids = messages, text, ids
    return "taken", ""


class Episodes:
    """Runs a batch's trajectories on one engine; one instance per generator, its environment processes kept."""

    def __init__(self, llm, recipe, code_dirs: list[str] = ()):
        """`code_dirs`: where the driver found the environment's module (``grpo_ray.rewards.shipped``)."""
        e = recipe.environment
        self.llm, self.env = llm, e
        self.banned = vision.placeholder_ids(llm.llm_engine.model_config.hf_config)  # never sampled (its images)
        search_here(*code_dirs)  # before the children start: they are spawned with this sys.path
        tokenizer = llm.get_tokenizer()
        self.marker = vision.marker(tokenizer) if self.banned else ""
        """A vision-language model's image marker: an observation's images are these before its text."""
        self.most_images = images.limit(recipe.generator.vllm_kwargs)
        self.tokenizer, self.recipe = tokenizer, recipe
        self.observations = Observations.of(tokenizer, e.role, recipe.model.chat_template_kwargs)
        self.roles = {e.role: self.observations}
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        self.played = played(e)
        """Each environment by its label ("": environment.name's, for rows that choose none)."""
        self.pool = ThreadPoolExecutor(max_workers=2 * e.workers, thread_name_prefix="env")
        self.agents = None
        """An agent program's runs (environment.name agent: ``grpo_ray.rollouts.agents``) instead of children."""
        if program(e):
            from grpo_ray.rollouts.agents import AgentRuns

            self.children, self.agents = [], AgentRuns(self)
        else:
            self.children = [EnvChild(jail(recipe), list(self.played.values())) for _ in range(e.workers)]
        self.reported: set[str] = set()
        self.keys = itertools.count()
        """Each group's key (its trajectories' are key/sample, their turns' requests key/sample/turn)."""
        self.unsent: dict[str, str] = {}
        """The first failure of each kind (its traceback or what happened) not yet handed to the driver."""

    def run(self, prompts: list[Prompt], n: int, seeds: list[int], sampling, lora_request=None, loop=None):
        """`n` trajectories of each prompt (prompt i's seeded from seeds[i]), group after group; `sampling` is each
        turn's (a SamplingConfig). On `loop` (the engine's, streaming), or on a loop of its own until they have
        ended."""
        own = loop is None
        loop = loop or EngineLoop(self.llm.llm_engine)
        try:
            groups = [self.start(p, n, seed, sampling, loop, lambda: lora_request) for p, seed in zip(prompts, seeds)]
            return [dataclasses.replace(c, prompt=i) for i, g in enumerate(groups) for c in g.result()]
        finally:
            if own:
                loop.stop()

    def start(self, prompt: Prompt, n: int, seed: int, sampling, loop: EngineLoop, lora=lambda: None) -> Future:
        """Start `n` trajectories of `prompt` (seeded from `seed`) on `loop`, each turn a request of its own served
        with the adapters `lora()` names as it is sent. The future gives the trajectories (prompt index 0) once each
        has ended; cancelling it stops them (``Running``)."""
        if self.agents:
            return self.agents.start(prompt, n, seed, sampling, loop, lora)
        key = next(self.keys)
        children = [self.children[(key * n + j) % len(self.children)] for j in range(n)]
        ts = [Trajectory(0, seed, f"{key}/{j}", child, given=len(prompt.images)) for j, child in enumerate(children)]
        group = Running(self, prompt, ts, sampling, loop, lora)
        group.open()
        return group.future

    def _turn_params(self, t: Trajectory, turn: int, sampling, budget: int):
        """vLLM's sampling parameters for `turn` of trajectory `t`: the recipe's sampling, at most what is left of
        the trajectory's token budget, the environment's stop strings, a seed of its own."""
        seed = turn_seed(t.seed, int(t.key.split("/")[1]), turn)
        left = budget - len(t.ids) - t.extra
        return turn_params(sampling, self.env.stop, min(sampling.max_tokens, left), seed, self.banned)

    def _add_turn(self, t: Trajectory, request, images: bool) -> bool:
        """Append a model turn (vLLM's output of its `request`); whether the trajectory ends with it (cut at
        sampling.max_tokens). With `images` (a vision-language model: its prompt or any observation may hold some),
        where the engine's expanded tokens put the turn is kept too."""
        out = request.outputs[0]
        if images:
            t.turns_at.append((len(request.prompt_token_ids), len(t.ids), len(out.token_ids)))
            t.context = list(request.prompt_token_ids)
        ids = list(out.token_ids)
        t.ids += ids
        t.mask += [1] * len(ids)
        t.logprobs += [lp[tok].logprob for tok, lp in zip(ids, out.logprobs)]
        t.versions += [int(span.version) for span in out.weight_versions or [] for _ in range(span.start, span.end)]
        text = self.decode(ids)
        t.texts.append(text)
        t.episode.turns.append(text)
        if out.finish_reason == "length" or not ids:
            t.finish_reason, t.episode.ended = "length", "length"
            return True
        t.closed = ids[-1] in self.observations.eos_ids  # else a stop string ended it (environment.stop)
        return False

    def _goes_on(self, t: Trajectory, step: dict, budget: int, max_turns: int) -> bool:
        """Apply the environment's answer to the last turn (none yet after a reset); whether another turn follows."""
        e = t.episode
        if step:
            e.reward += step["reward"]
            e.rewards.append(step["reward"])
            e.tool_calls += step["tool_call"]
            e.tool_errors += step["tool_error"]
            if e.ended == "length":  # the cut turn's step: the episode's last, whatever it says
                return False
            if step["done"]:
                e.ended = "done"
                return False
            if len(e.turns) // 2 + 1 >= max_turns:
                e.ended = "turns"
                return False
            if len(step["observation"]) > self.env.max_observation_chars:
                return self._failed(
                    t,
                    "error",
                    f"answered {len(step['observation'])} characters, over environment.max_observation_chars",
                )
            shown, before = step.get("images") or [], len(t.images) + t.given
            if shown and (not self.marker or before + len(shown) > self.most_images):
                why = f"{before} were shown before" if self.marker else "the model (its chat template) reads no images"
                return self._failed(
                    t,
                    "error",
                    f"answered {len(shown)} image(s), and {why}: at most {self.most_images} a trajectory "
                    "(generator.vllm_kwargs.limit_mm_per_prompt)",
                )
            try:  # the markers as the template's special tokens; the text with special tokens split
                head = self.tokenizer(self.marker * len(shown), add_special_tokens=False)["input_ids"] if shown else []
                ids = self.pieces(step.get("role") or self.env.role).ids(step["observation"], t.closed, head)
            except TemplateError as err:
                return self._failed(t, "error", f"answered a {step['role']} message: {err}")
            extra = self.expansion(shown)
            if len(t.ids) + t.extra + len(ids) + extra >= budget:  # no room left for a model token after it
                e.ended = "tokens"
                return False
            t.images, t.extra = t.images + shown, t.extra + extra
            t.ids += ids
            t.mask += [0] * len(ids)
            t.logprobs += [0.0] * len(ids)
            t.versions += t.versions[-1:] * len(ids)
            text = self.decode(ids)
            t.texts.append(text)
            e.turns.append(step["observation"])
        return True

    def expansion(self, shown: list[bytes]) -> int:
        """The tokens the engine's expansion of the `shown` images' markers adds (and a token or two more each: vLLM
        tokenizes an image's sequence apart from the text around it)."""
        if not shown:
            return 0
        path, trust = self.llm.llm_engine.model_config.model, self.recipe.model.trust_remote_code
        text = self.marker * len(shown)
        marked = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return len(vision.expanded_ids(path, text, vision.sizes(shown), trust)) - marked + 2 * len(shown)

    def pieces(self, role: str) -> Observations:
        """The template's pieces around an observation of `role` (read once per role)."""
        if role not in self.roles:
            self.roles[role] = Observations.of(self.tokenizer, role, self.recipe.model.chat_template_kwargs)
        return self.roles[role]

    def _reset(self, t: Trajectory, p: Prompt) -> str | None:
        """Start the trajectory's episode: its opening observation ('' for none), None when the environment
        failed."""
        t.generation = t.child.generation
        name, given = self.played[p.env_choice]
        outcome, answer = self._call(t, ("reset", t.key, name, given, p.env_row()))
        return (answer or "") if outcome == "ok" else None

    def _opened(self, prompt: Prompt, ts: list[Trajectory], openings: list[str | None]) -> list[dict | None]:
        """The group's prompt after its episodes' openings (``environment.opening``), rewritten in place where an
        opening becomes its user turn; per trajectory {} when it goes on, None when it failed (its reset, or an
        opening the recipe refuses: the group's are then all refused)."""
        given = [o for o in openings if o is not None]
        if not any(given) or self.env.opening == "ignore":
            return [None if o is None else {} for o in openings]
        first, other = given[0], next((o for o in given if o != given[0]), None)
        if other is not None:
            outcome, why = (
                "differ",
                (
                    f"its episodes opened differently ({first[:60]!r}, {other[:60]!r}): an environment draws its task "
                    "from the row (a seed in its extra_info), so that a group answers one prompt"
                ),
            )
        else:
            outcome, why = open_prompt(prompt, first, self.tokenizer, self.recipe)
        refused = outcome in ("differ", "long") or outcome == "mismatch" and self.env.opening == "check"
        for t, o in zip(ts, openings):
            if o is None:
                continue
            if refused:
                self._failed(t, "error", why)
                self.pool.submit(t.child.run, ("drop", t.key), self.env.timeout_s)
            elif outcome == "mismatch":
                t.episode.opening_mismatch = True
                self._failed(t, "opening", why, ends=False)
        return [None if o is None or refused else {} for o in openings]

    def _step(self, t: Trajectory, turn: str, cut: bool = False, last: bool = False) -> dict | None:
        """The environment's answer to the trajectory's last turn (`cut`: at the token limit, its last; `last`: the
        turn limit's); None when it failed."""
        if t.child.generation != t.generation:
            self._failed(t, "lost", FAILED["lost"])
            return None
        outcome, answer = self._call(t, ("step", t.key, turn, cut, last))
        return answer if outcome == "ok" else None

    def _call(self, t: Trajectory, call: tuple) -> tuple[str, object]:
        start = time.perf_counter()
        outcome, answer = t.child.run(call, self.env.timeout_s)
        t.episode.seconds += time.perf_counter() - start
        if outcome != "ok":
            self._failed(t, outcome, answer if outcome == "error" else f"{call[0]} {FAILED[outcome]}")
        return outcome, answer

    def _failed(self, t: Trajectory, outcome: str, text: str, ends: bool = True) -> bool:
        """End the trajectory on an environment failure (unless not `ends`: a mismatched opening, counted); its
        first of each kind is shown once per engine."""
        if ends:
            t.episode.failure = t.episode.ended = "error" if outcome in ("lost", "died", "memory") else outcome
        if outcome not in self.reported:
            self.reported.add(outcome)
            self.unsent[outcome] = f"in trajectory {t.key}:\n{text}"
            what = "failed " if ends else ""
            print(f"environment {self.env.name} {what}({outcome}) in trajectory {t.key}:\n{text}", file=sys.stderr)
        return False

    def new_failures(self) -> dict[str, str]:
        """The first failures of each kind not yet handed over (``RolloutStats.failures``), by kind."""
        out, self.unsent = self.unsent, {}
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for c in self.children:
            c.close()
        if self.agents:
            self.agents.close()


class Running:
    """One group's trajectories on the engine's loop (``Episodes.start``), turn to turn in callbacks: an answered
    turn hands its environment call to the pool, an answered call sends the next turn; the engine meanwhile serves
    the others. `future` gives the trajectories once each has ended.

    Cancelling `future` (a notice's hand-back, ``Looping.hand_back``; from any thread but the loop's) stops the
    group: its turns in flight are aborted, none is sent after (a turn is sent under the lock, after a look at the
    future), and each trajectory ends as its environment call in flight comes back, its episode dropped."""

    def __init__(self, episodes: Episodes, prompt: Prompt, ts: list[Trajectory], sampling, loop: EngineLoop, lora):
        self.episodes, self.prompt, self.ts, self.sampling = episodes, prompt, ts, sampling
        self.loop, self.lora = loop, lora
        """`lora()`: the adapters a turn sent now is served with."""
        self.future: Future = Future()
        self.lock, self.left = threading.Lock(), len(ts)
        self.turns: dict[str, Future] = {}
        """Each trajectory's last turn sent (by its key)."""
        self.future.add_done_callback(self._stopped)

    def open(self) -> None:
        """Reset the group's episodes; once all have answered, its prompt meets their openings (``_opened``) and
        each trajectory goes on (``answered``, with its reset's outcome)."""
        ep, ts = self.episodes, self.ts
        resets, waiting, lock = [ep.pool.submit(ep._reset, t, self.prompt) for t in ts], [len(ts)], threading.Lock()

        def reset(_) -> None:
            with lock:
                waiting[0] -= 1
                if waiting[0]:
                    return
            try:
                started = ep._opened(self.prompt, ts, [f.result() for f in resets])
            except BaseException as e:
                self.fail(e)
                return
            for t, answer in zip(ts, started):
                self.then(self.answered, t)(done_future(answer))

        for f in resets:
            f.add_done_callback(reset)

    def fail(self, e: BaseException) -> None:
        """An error in a callback fails the group (its future's result raises it)."""
        with self.lock, contextlib.suppress(InvalidStateError):  # (done, failed or cancelled already)
            self.future.set_exception(e)

    def then(self, fn, t: Trajectory):
        """A done-callback: `fn(t, the result)`, its error failing the group; once the group is cancelled, what
        came back is dropped and `t` ends."""

        def run(future: Future) -> None:
            if self.future.cancelled():
                self.ended(t)
                return
            try:
                fn(t, future.result())
            except BaseException as e:
                self.fail(e)

        return run

    def answered(self, t: Trajectory, answer: dict | None) -> None:
        """The environment's answer, after reset or a turn: the next turn sent, or the trajectory's end."""
        ep, env, prompt = self.episodes, self.episodes.env, self.prompt
        if not (
            (answer is None and not t.ids)
            or (answer is not None and ep._goes_on(t, answer, env.max_tokens, env.max_turns))
        ):
            self.ended(t)
            return
        turn = len(t.episode.turns) // 2  # a failed reset still generates the first turn (a trajectory has at
        params = ep._turn_params(t, turn, self.sampling, env.max_tokens)  # least one token), then ends
        request = {"prompt_token_ids": prompt.ids + t.ids}
        if prompt.images or t.images:
            request["multi_modal_data"] = {"image": vision.decoded(prompt.images + t.images)}
        with self.lock:
            if self.future.cancelled():
                sent = done_future(None)  # (the group handed back as this came: ended at once below)
            else:
                sent = self.turns[t.key] = self.loop.submit(request, params, self.lora(), f"{t.key}/{turn}")
        sent.add_done_callback(self.then(self.generated, t))

    def generated(self, t: Trajectory, out) -> None:
        """A turn answered by the engine: its environment call (a cut turn is stepped too, truncated, as the
        episode's last)."""
        ep = self.episodes
        cut = ep._add_turn(t, out, bool(ep.banned))  # a VL model's: images may come in any turn
        last = len(t.episode.turns) // 2 + 1 >= ep.env.max_turns  # the turn limit's turn (as _goes_on counts)
        if t.episode.failure:
            self.ended(t)
        else:
            ep.pool.submit(ep._step, t, t.episode.turns[-1], cut, last).add_done_callback(self.then(self.answered, t))

    def ended(self, t: Trajectory) -> None:
        """Trajectory `t` has ended: its episode dropped where its process still holds it (a done or cut one is
        closed by its process as it answers), and the group's result set once all have."""
        ep = self.episodes
        if not t.episode.failure and (self.future.cancelled() or t.episode.ended not in ("done", "length")):
            ep.pool.submit(t.child.run, ("drop", t.key), ep.env.timeout_s)
        with self.lock:
            self.left -= 1
            if self.left == 0:
                with contextlib.suppress(InvalidStateError):  # (failed, or cancelled meanwhile: handed back)
                    self.future.set_result([t.completion() for t in self.ts])

    def _stopped(self, future: Future) -> None:
        if future.cancelled():
            with self.lock:
                sent = list(self.turns.values())
            self.loop.abort(sent)


def episode_values(completions: list[Completion]) -> dict[str, list[float]]:
    """The env/* metrics' values per trajectory of a rollout, in its order (``telemetry.metrics.env_metrics`` sums and
    divides; DAPO's group filter keeps the kept trajectories' own). Every trajectory has its episode and mask."""
    rows = [
        {
            "trajectories": 1,
            "turns": (len(c.episode.turns) + 1) // 2,
            "tool_calls": c.episode.tool_calls,
            "tool_errors": c.episode.tool_errors,
            "errors": c.episode.failure == "error",
            "timeouts": c.episode.failure == "timeout",
            "seconds": c.episode.seconds,
            "opening_mismatches": c.episode.opening_mismatch,
            "off_record_calls": c.episode.off_record,
            "ended_by_turns": c.episode.ended == "turns",
            "ended_by_tokens": c.episode.ended in ("tokens", "length"),
            "model_tokens": sum(c.mask),
            "tokens": len(c.token_ids),
            "reward": c.episode.reward,
        }
        for c in completions
    ]
    return {k: [float(r[k]) for r in rows] for k in rows[0]} if rows else {}
