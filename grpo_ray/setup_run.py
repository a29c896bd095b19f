"""Everything `train` checks and builds before any actor starts.

Recipe problems, unknown rewards, unreadable data and prompts that are too long
are found here, on the driver, so a mistake costs seconds, not a cluster start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grpo_ray import models, rundir, transports
from grpo_ray.config import (
    KINDS,
    REWARD_MODEL,
    EnvironmentConfig,
    Recipe,
    RecipeError,
    dump_recipe,
    recipe_yaml,
)
from grpo_ray.data import DataError, checked, dotted, images, load_rows, prompt_text
from grpo_ray.data.targets import RM_IDS, rm_tokens, target_tokens
from grpo_ray.models import vision
from grpo_ray.models.dims import ModelDims, model_dims
from grpo_ray.preflight import (
    check_algorithm,
    check_sources,
    check_stack,
    image_rows,
    load_rewards,
    reward_child,
    try_environment,
    try_rewards,
)
from grpo_ray.rewards.learned import STYLED


@dataclass
class RunInputs:
    """What the controller needs to start the pools."""

    model_path: str
    """Loadable by transformers and vLLM (a tiny model is built by now)."""
    dims: ModelDims
    """The model's shape, read once here: the pools' memory sizes and the learner's FLOPs count use it."""
    train_rows: list[dict]
    """Usable training rows, each with 'prompt_ids' and 'prompt_text' added."""
    val_rows: list[dict]
    """Usable validation rows, each with 'prompt_ids' and 'prompt_text' added."""
    dropped: dict[str, int]
    """Rows dropped per file for a prompt over data.max_prompt_length."""
    output_dir: Path
    """The run's directory, holding config.yaml."""
    probe_ids: list[int]
    """A fixed token sequence scored by a generator and the learner after each weight sync."""
    resume: Path | None = None
    """The checkpoint the run continues from (grpo_ray.rundir), or None for a fresh start."""
    scorer_models: dict[str, str] = field(default_factory=dict)
    """The scorers' own models by their recipe key (teacher.model, reward_model.model), each checked as its pool
    needs it and loadable by transformers (built or trained by now); none for a pool that is off."""

    @property
    def paths(self) -> dict[str, str]:
        """Each model's path by its recipe key, as the pool kinds name their model (``KINDS[pool].model``)."""
        return {"model.path": self.model_path, **self.scorer_models}


def _pass_rates(recipe: Recipe, val_rows: list[dict]) -> list[str]:
    n = recipe.generator.val_n
    return sorted({f"val/{row['data_source']}/pass@{k}" for row in val_rows for k in {1, n}})


@dataclass(frozen=True)
class Job:
    """What a command's run checks and builds before start (``JOBS``): a job's own, not a branch on its name."""

    rows: Callable | None = None
    """What its training rows carry beyond the prompt, from a row (``data.targets``): SFT's target, a reward model's
    conversations."""
    over: Callable[[dict, Recipe], bool] = lambda extra, r: False
    """Whether what `rows` made is over its limit (the row is dropped and counted)."""
    limit: Callable[[Recipe], str] = lambda r: ""
    """That limit, as a user reads it."""
    answers: bool = True
    """Its rows need a ground truth."""
    samples: bool = False
    """It samples and scores (GRPO): the algorithm, the rewards and the environment are tried on the first row, and
    its scorers' own models checked and resolved, before start."""
    validation: Callable[[Recipe, list[dict]], list[str]] = _pass_rates
    """The metrics its validation reports on these rows (what trainer.early_stop.metric may name)."""
    validation_rows: str = ""
    """The job whose rows its validation rows are (``JOBS``): plain prompts, or a reward model's conversations."""


RM_VALIDATION = ("val/rm/accuracy", "val/rm/loss")
"""What a reward model's validation reports (``grpo_ray.jobs.rm``)."""

JOBS = {
    "": Job(),  # validation rows: a prompt and its answer
    "train": Job(samples=True),
    "sft": Job(
        rows=target_tokens,
        over=lambda extra, r: len(extra["target_ids"]) > r.sft.max_target_length,
        limit=lambda r: f" or its target than sft.max_target_length={r.sft.max_target_length}",
    ),
    "rm": Job(
        rows=rm_tokens,
        over=lambda extra, r: max(len(extra[k]) for k in RM_IDS if k in extra) > r.rm.max_length,
        limit=lambda r: f" or its conversation than rm.max_length={r.rm.max_length}",
        answers=False,  # a reward model's rows need no ground truth
        validation=lambda r, rows: list(RM_VALIDATION) if rows else [],
        validation_rows="rm",
    ),
}
"""Each command's job; usable_rows' command "" reads validation rows."""


def usable_rows(
    files: list[str],
    tokenizer,
    recipe: Recipe,
    dropped: dict[str, int],
    command: str = "",
    first_dropped: list[str] | None = None,
) -> list[dict]:
    """Rows whose prompt fits data.max_prompt_length, with 'prompt_ids' and 'prompt_text' added; for `command` sft
    also 'target_ids' (and 'target_mask' for a multi-turn trace: ``target_tokens``), dropping targets over
    sft.max_target_length; for rm the rendered conversations (``rm_tokens``), dropping those over rm.max_length.
    A row without what its command needs is a DataError naming the file and row; the first row dropped for its
    length is said in `first_dropped`."""
    rows, pieces = [], {}  # pieces: each observation role's template pieces, read once (multi-turn SFT traces)
    for spec in files:
        name = checked.key(spec, tokenizer, recipe, command)
        got = checked.load(name)  # read and tokenized by an earlier run: the same bytes, tokenizer, keys and limits
        if got is None:
            got = _rows_of(spec, tokenizer, recipe, command, pieces)
            checked.save(name, *got)
        some, dropped[spec], first = got
        some = choose_environments(recipe.environment, some, spec, exact=not dropped[spec])
        rows += some
        if first and first_dropped is not None and not first_dropped:
            first_dropped.append(first)
        if dropped[spec] and not rows:
            raise DataError(f"{spec}: every prompt is longer than {_limits(recipe, command)}")
    return rows


def choose_environments(e: EnvironmentConfig, rows: list[dict], spec: str, exact: bool) -> list[dict]:
    """With environment.choices, each row with its ``env_choice``: the label its ``environment.row_key`` names ("":
    none, environment.name's); a label not among the choices is a DataError naming the row (`exact`: the rows are
    the file's, none dropped, so their index is its row)."""
    if not e.choices:
        return rows
    out = []
    for i, row in enumerate(rows):
        label = dotted(row, e.row_key)
        if label not in (None, "") and str(label) not in e.choices:
            where = f"{spec} row {i}" if exact else f"{spec} (usable row {i})"
            raise DataError(
                f"{where}: {e.row_key}={label!r} is none of environment.choices ({', '.join(e.choices)}); a row "
                "that names none plays environment.name"
            )
        out.append({**row, "env_choice": "" if label in (None, "") else str(label)})
    return out


def _rows_of(spec: str, tokenizer, recipe: Recipe, command: str, pieces: dict) -> tuple[list[dict], int, str]:
    """``usable_rows`` of one file: its usable rows, how many were dropped, and the first dropped's reason."""
    job = JOBS[command]
    answer_key = recipe.data.answer_key if job.answers else ""
    loaded = load_rows(spec, recipe.data.prompt_key, answer_key)
    if any(images.images_of(row, recipe.data.image_key) for row in loaded):
        loaded = image_rows(spec, loaded, recipe, tokenizer.name_or_path, command)
    texts = [
        prompt_text(
            tokenizer, row, recipe.data.response_prefix, recipe.model.chat_template_kwargs, recipe.data.system_prompt
        )
        for row in loaded
    ]
    prompts = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []  # one call: batched
    rows, n, first = [], 0, ""
    for i, (row, text, ids) in enumerate(zip(loaded, texts, prompts)):
        extra, where = {"prompt_ids": ids, "prompt_text": text}, f"{spec} row {i}"
        if job.rows:
            extra.update(job.rows(row, recipe, tokenizer, where, pieces))
        pictures, length = row.get("prompt_images"), len(ids)
        if pictures:  # each image's marker stands for the image's tokens: an engine expands it, SFT trains on them
            sizes = vision.sizes(pictures)
            full = list(vision.expanded_ids(tokenizer.name_or_path, text, sizes, recipe.model.trust_remote_code))
            extra["prompt_ids"], length = full if command == "sft" else ids, len(full)
        if length > recipe.data.max_prompt_length or job.over(extra, recipe):
            n += 1
            first = first or f"{where} is over {_limits(recipe, command)}"
            continue
        rows.append({**row, **extra})
    return rows, n, first


def _limits(recipe: Recipe, command: str) -> str:
    """The limits a row of `command` is measured against, as a user reads them."""
    return f"data.max_prompt_length={recipe.data.max_prompt_length}" + JOBS[command].limit(recipe)


def teacher_base(recipe: Recipe, tokenizer) -> str:
    """teacher.model resolved (an ``sft://`` one: its base, whose tokenizer it keeps), after checking that it
    tokenizes as the policy does: the teacher scores the policy's token ids, so a token must mean the same to both."""
    from transformers import AutoConfig

    name, trust = recipe.teacher.model, recipe.model.trust_remote_code
    path = models.base_of(name)
    try:
        kind = (AutoConfig.from_pretrained(path, trust_remote_code=trust).architectures or [""])[0]
    except (OSError, ValueError) as e:
        raise RecipeError(f"teacher.model={name!r}: cannot load its config ({str(e).splitlines()[0]})") from None
    if kind and not kind.endswith("ForCausalLM") and not images.model_reads_images(path, trust)[0]:  # (a VL model)
        raise RecipeError(
            f"teacher.model={name!r}: a {kind}, not a language model (ForCausalLM): a teacher gives a logprob of each "
            "of the policy's tokens (a classifier belongs in reward_model.model)"
        )
    try:
        theirs = models.tokenizer_class(path, trust).from_pretrained(path, trust_remote_code=trust).get_vocab()
    except (OSError, ValueError) as e:
        raise RecipeError(f"teacher.model={name!r}: cannot load a tokenizer ({str(e).splitlines()[0]})") from None
    ours = tokenizer.get_vocab()
    if theirs != ours:
        differ = sum(theirs.get(t) != i for t, i in ours.items())
        raise RecipeError(
            f"teacher.model={name!r}: its tokenizer is not model.path's ({len(theirs)} tokens against "
            f"{len(ours)}, {differ} of the policy's with another id or none); the teacher scores the policy's "
            "token ids, so both must share one tokenizer (distillation across tokenizers is not supported)"
        )
    return path


def reward_model_path(recipe: Recipe) -> str:
    """reward_model.model resolved (a tiny one built), after checking that it is what the pool loads: a sequence
    classifier with one output, or a language model when reward_model.judge.template makes it a judge."""
    from transformers import AutoConfig

    name, judge = recipe.reward_model.model, bool(recipe.reward_model.judge.template)
    path = models.resolve(name)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=recipe.model.trust_remote_code)
    except (OSError, ValueError) as e:
        raise RecipeError(f"reward_model.model={name!r}: cannot load its config ({str(e).splitlines()[0]})") from None
    kind = (config.architectures or ["a model that names no architecture"])[0]
    classifier = kind.endswith("ForSequenceClassification")
    generates = kind.endswith("ForCausalLM") or (getattr(config, "vision_config", None) is not None and not classifier)
    if judge and not generates:  # a language model, or a vision-language one
        raise RecipeError(
            f"reward_model.model={name!r}: a {kind}, not a language model (ForCausalLM) that a judge's rubric "
            "(reward_model.judge.template) can ask; unset the template to use a classifier"
        )
    if not judge and not classifier:
        raise RecipeError(
            f"reward_model.model={name!r}: a {kind}, not a sequence classifier (AutoModelForSequenceClassification "
            "with one output, as Skywork and ArmoRM reward models are); to use a language model as a generative "
            "judge, give it a rubric in reward_model.judge.template"
        )
    head, outputs = recipe.reward_model.head, config.num_labels
    if classifier and head < 0 and outputs != 1:
        raise RecipeError(
            f"reward_model.model={name!r}: its classifier has {outputs} outputs; set reward_model.head to the one "
            f"that is the score (0 to {outputs - 1})"
        )
    if classifier and head >= outputs:
        raise RecipeError(
            f"reward_model.head={head}: reward_model.model={name!r} has {outputs} output{'s' * (outputs > 1)} "
            f"(0 to {outputs - 1})"
        )
    if judge:
        check_judge_context(recipe, path)
    return path


def check_judge_context(recipe: Recipe, path: str) -> None:
    """The judge's context holds its rubric (the template without what fills it, in the judge's chat template) and
    a reply, and its model has that many positions."""
    from grpo_ray.lengths import judge_context
    from grpo_ray.rewards.learned import PLACEHOLDER

    j, name = recipe.reward_model.judge, recipe.reward_model.model
    context, positions = judge_context(recipe), model_dims(path, "reward_model.model").max_positions
    how = f"reward_model.judge.max_model_len={j.max_model_len}" if j.max_model_len else "its default"
    if positions and context > positions:
        raise RecipeError(
            f"the judge's context ({context} tokens, {how}) is over reward_model.model={name!r}'s "
            f"max_position_embeddings ({positions}); set reward_model.judge.max_model_len to at most that"
        )
    trust = recipe.model.trust_remote_code
    tokenizer = models.tokenizer_class(path, trust).from_pretrained(path, trust_remote_code=trust)
    turn = [{"role": "user", "content": PLACEHOLDER.sub("", j.template)}]
    rubric = len(
        tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=True, return_dict=False)
        if tokenizer.chat_template
        else tokenizer(turn[0]["content"])["input_ids"]
    )
    if rubric + j.max_tokens >= context:
        raise RecipeError(
            f"reward_model.judge.template: the rubric alone is {rubric} tokens, and with a reply of "
            f"reward_model.judge.max_tokens={j.max_tokens} it fills the judge's context ({context} tokens, {how}), "
            "leaving no room for the prompt and response; raise reward_model.judge.max_model_len or shorten the rubric"
        )


def _resolved(recipe: Recipe, tokenizer, kind) -> str:
    """A scorer's own model found or built (a ``tiny://`` one), not checked further."""
    return models.resolve(kind.model_name(recipe))


MODEL_CHECKS = {
    "teacher_base": lambda recipe, tokenizer, kind: teacher_base(recipe, tokenizer),
    "reward_model_path": lambda recipe, tokenizer, kind: reward_model_path(recipe),
    "": _resolved,
}
"""How a scorer pool with a model of its own checks it before start (with the policy's tokenizer) and resolves it,
by the name its row gives (``PoolKind.checked``; none: resolved only)."""


def check_styles(rows: list[dict]) -> None:
    """With reward_model.by_style, every training row's reward_model.style must name its reward."""
    for i, row in enumerate(rows):
        style = (row.get("reward_model") or {}).get("style")
        if style not in STYLED:
            raise DataError(
                f"data.train_files row {i}: reward_model.style={style!r}; with reward_model.by_style each row says "
                f"{', '.join(STYLED)} (or turn reward_model.by_style off: every row gets both)"
            )


def setup_run(
    recipe: Recipe,
    command: str = "train",
    recipe_dir: Path | None = None,
    warm_start: Callable[[str], str] | None = None,
) -> RunInputs:
    """Check the output directory, rewards, build or locate the model, load and tokenize data, write config.yaml.
    For `command` sft the training rows carry their targets. A model made by an SFT recipe (``sft://``) is
    made by `warm_start` (the job layer passes grpo_ray.jobs.sft.warm_start; without it, only the cache is looked in),
    once the data has been checked with its tokenizer (the base model's). Reward modules are looked for in the
    working directory and `recipe_dir`, and each reward function is tried on the first training row."""
    output_dir = rundir.writable_dir(recipe.trainer.output_dir, "trainer.output_dir")
    check_stack()  # a package pip brought back that breaks transformers: one line now, not in every actor later
    transports.check(recipe)  # the weight transport exists and has what it needs (the storage one: its directory)
    load_rewards(
        recipe.reward, recipe_dir
    )  # also puts the working directory and the recipe's folder on the import path
    if JOBS[command].samples:
        check_algorithm(recipe.algorithm)
    child = reward_child(recipe.reward) if JOBS[command].samples and recipe.reward.functions else None
    try:
        return _setup_run(recipe, command, output_dir, warm_start, child)
    finally:
        if child:  # closed by try_rewards unless a check before it failed
            child.close()


def _setup_run(recipe: Recipe, command: str, output_dir: Path, warm_start, child) -> RunInputs:
    model_path = models.base_of(recipe.model.path)
    tokenizer = models.load_tokenizer(model_path, recipe.model, lazy=True)  # rows checked before need none
    dropped: dict[str, int] = {}
    first_dropped: list[str] = []
    train_rows = usable_rows(recipe.data.train_files, tokenizer, recipe, dropped, command, first_dropped)
    val_rows = usable_rows(recipe.data.val_files, tokenizer, recipe, dropped, JOBS[command].validation_rows)
    if len(train_rows) < recipe.data.train_batch_size:
        n = sum(dropped.get(f, 0) for f in recipe.data.train_files)
        why = f"; {n} dropped, the first: {first_dropped[0]}" if first_dropped else ""
        raise DataError(
            f"data.train_files give {len(train_rows)} usable rows, fewer than "
            f"data.train_batch_size={recipe.data.train_batch_size}{why}"
        )
    job = JOBS[command]
    if job.samples:
        check_sources(recipe, train_rows, val_rows)
    if job.samples and recipe.reward.functions:
        try_rewards(recipe, train_rows[0], "the first training row", child)
    if job.samples and recipe.environment.name:
        try_environment(recipe, tokenizer, train_rows)
    scorers = {  # each scorer's own model, checked as its pool needs it (resolved, by default)
        k.model: MODEL_CHECKS[k.checked](recipe, tokenizer, k)
        for k in KINDS.values()
        if job.samples and k.model and k.model != "model.path" and k.count(recipe)
    }
    if scorers.get(KINDS[REWARD_MODEL].model) and recipe.reward_model.by_style:
        check_styles(train_rows)
    metric, offered = recipe.trainer.early_stop.metric, job.validation(recipe, val_rows)
    if metric and metric not in offered:
        raise RecipeError(
            f"trainer.early_stop.metric={metric!r}: validation reports {', '.join(offered) or 'nothing'} "
            f"for data.val_files"
        )
    resume = rundir.prepare(
        output_dir, recipe.trainer, recipe_yaml(recipe), job=command
    )  # refuses to lose a run's files

    def trained(name: str) -> str:  # an sft:// model, made by the warm start (or found in the cache)
        return warm_start(name.removeprefix(models.SFT_SCHEME)) if warm_start else models.resolve(name)

    if models.is_sft(recipe.model.path):
        model_path = trained(recipe.model.path)
    for k in KINDS.values():  # an sft:// teacher: checked on its base, trained now
        if k.model in scorers and models.is_sft(k.model_name(recipe)):
            scorers[k.model] = trained(k.model_name(recipe))
    dump_recipe(recipe, output_dir / "config.yaml")
    dims = model_dims(model_path)  # once, from the model as built or trained
    first = train_rows[0]["prompt_ids"]
    return RunInputs(model_path, dims, train_rows, val_rows, dropped, output_dir, first, resume, scorers)
