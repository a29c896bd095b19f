"""Reading a recipe (YAML, ``a.b=c`` overrides, unknown keys named with where they came from and the closest
valid key, verl and NeMo RL keys mapped to ours) and writing it back with secrets redacted."""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grpo_ray.config.checks import validate
from grpo_ray.config.plugins import import_plugins, recipe_class
from grpo_ray.config.schema import Recipe, RecipeError

# --- loading -----------------------------------------------------------------------------


def load_recipe(path: str | os.PathLike, overrides: list[str] = (), command: str = "train") -> Recipe:
    """Read, override, type-check and validate a recipe for `command` (train: GRPO, sft: one sample per row);
    raise RecipeError on any problem."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe {str(path)!r} does not exist")
    try:
        user = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends: the message carries line and column
        raise RecipeError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(user, DictConfig):
        raise RecipeError(f"{path}: the top level must be a mapping of sections, got a {type(user).__name__}")
    _take_aliases(user)
    user, overrides = _verl_reward(user, list(overrides), path)
    import_plugins(_plugins(user, overrides, path), near=(str(path.parent), "."))  # their sections are keys
    problems = check_keys(user, recipe_class(), origin=str(path))
    for item in overrides:
        user = _override(user, item, problems)
    problems += _engine_range(user, path)
    if problems:
        raise RecipeError(
            problems[0]
            if len(problems) == 1
            else f"{len(problems)} problems:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(recipe_class()), user)
        recipe = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        given = next((o for o in reversed(overrides) if key and o.removeprefix("+").split("=", 1)[0] == key), None)
        raise RecipeError(f"{f'override {given!r}' if given else path}: {_type_message(e)}") from None
    problems = validate(recipe, command)
    if problems:
        raise RecipeError(f"{path}: the recipe cannot run:\n" + "\n".join(f"  - {p}" for p in problems))
    return recipe


def _plugins(user: DictConfig, overrides: list[str], path: Path) -> list[str]:
    """The modules the recipe's ``plugins`` names, its overrides' last word on it included."""
    names = user.get("plugins", [])
    for item in overrides:
        if item.removeprefix("+").split("=", 1)[0] == "plugins" and "=" in item:
            names = OmegaConf.from_dotlist([item.removeprefix("+")]).plugins
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, ListConfig)) or not all(isinstance(n, str) and n for n in names):
        raise RecipeError(f"{path}: plugins: expected a list of module names, got {names!r}")
    return list(names)


def _override(user: DictConfig, item: str, problems: list[str]) -> DictConfig:
    """`user` with one ``key=value`` override applied (``~key``: back to its default); an override that names a key
    the schema lacks adds its problem to `problems`; one that cannot be read raises RecipeError."""
    if item.startswith("~") and "=" not in item:  # Hydra's deletion: back to the default
        problems += _reset(user, item[1:], origin=f"override {item!r}")
        return user
    if "=" not in item:
        raise RecipeError(
            f"override {item!r}: expected key=value (or ~key for its default), e.g. trainer.total_steps=10"
        )
    if re.search(r"\[\d+\]|(^|\.)\d+(\.|$)", item.split("=", 1)[0]):
        whole = re.split(r"\[\d+\]|\.\d+", item.removeprefix("+").split("=", 1)[0])[0]
        raise RecipeError(
            f"override {item!r}: reaches into an element of the list {whole}; set the whole list instead, "
            f"e.g. {whole}=[...] (grpo-ray config shows its current value)"
        )
    try:
        one = OmegaConf.from_dotlist([item.removeprefix("+")])  # Hydra's "+" for new keys is accepted
    except OmegaConfBaseException as e:
        raise RecipeError(f"override {item!r}: {e}") from None
    except Exception as e:  # yaml's errors: the value is not valid YAML (an unclosed list, a stray quote)
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError(
            f"override {item!r}: the value is not valid YAML ({why}); quote it, or close its brackets"
        ) from None
    _take_aliases(one)
    found = check_keys(one, recipe_class(), origin=f"override {item!r}")
    problems += found
    if found:
        return user
    key = _renamed(item.removeprefix("+").split("=", 1)[0])
    if get_origin(_field_type(key)) is dict:  # a mapping value replaces the recipe's, not merged into it
        OmegaConf.update(user, key, OmegaConf.select(one, key), merge=False)
        return user
    return OmegaConf.merge(user, one)


def _type_message(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", None)
    first = str(e).splitlines()[0]
    if "missing mandatory value" in first.lower():
        return f"{key} is required"
    return f"{key}: {first}" if key else first


def _valid_keys(schema: type) -> dict[str, Any]:
    hints = get_type_hints(schema)
    return {f.name: hints[f.name] for f in fields(schema)}


def _all_paths(schema: type, prefix: str = "") -> list[str]:
    out = []
    for name, tp in _valid_keys(schema).items():
        out.append(prefix + name)
        if is_dataclass(tp):
            out += _all_paths(tp, prefix + name + ".")
    return out


FOREIGN_KEYS = {
    "logger.wandb_enabled": ("NeMo RL", "trainer.loggers (e.g. trainer.loggers=[console,jsonl,wandb])"),
    "logger.mlflow_enabled": ("NeMo RL", "trainer.loggers (e.g. trainer.loggers=[console,jsonl,mlflow])"),
    "logger.tensorboard_enabled": ("NeMo RL", "trainer.loggers (e.g. trainer.loggers=[console,jsonl,tensorboard])"),
    "logger.wandb.project": ("NeMo RL", "trainer.project_name"),
    "logger.wandb.name": ("NeMo RL", "trainer.experiment_name"),
    "logger.mlflow.experiment_name": ("NeMo RL", "trainer.project_name"),
    "logger.mlflow.run_name": ("NeMo RL", "trainer.experiment_name"),
    "logger.mlflow.tracking_uri": ("NeMo RL", "trainer.mlflow_tracking_uri"),
    "logger.log_dir": ("NeMo RL", "trainer.output_dir"),
    "trainer.default_local_dir": ("verl", "trainer.output_dir"),
    "trainer.total_training_steps": ("verl", "trainer.total_steps"),
    "trainer.rollout_data_dir": ("verl", "trainer.dump_freq (every this many steps, to <output_dir>/rollouts/)"),
    "trainer.dump_rollouts": ("an earlier grpo-ray", "trainer.dump_freq (0: never, 1: every step)"),
    "trainer.n_gpus_per_node": ("verl", "cluster.devices_per_node"),
    "trainer.nnodes": ("verl", "cluster.nodes"),
    "actor_rollout_ref.rollout.n": ("verl", "algorithm.group_size"),
    "actor_rollout_ref.rollout.ignore_eos": ("verl", "generator.sampling.ignore_eos"),
    "actor_rollout_ref.actor.optim.lr": ("verl", "learner.optim.lr"),
    "data.max_response_length": ("verl", "generator.sampling.max_tokens"),
    "data.val_batch_size": ("verl", "nothing (validation runs every data.val_files row at once)"),
    "data.reward_fn_key": ("verl", "data_source in each row (rows without one take the file's name)"),
    "actor_rollout_ref.model.path": ("verl", "model.path"),
    "actor_rollout_ref.model.use_remove_padding": ("verl", "model.sequence_packing"),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("verl", "learner.gradient_checkpointing"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("verl", "learner.mini_batch_size (in samples, not prompts)"),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("verl", "learner.micro_batch_size"),
    "actor_rollout_ref.actor.ppo_epochs": ("verl", "algorithm.ppo_epochs"),
    "actor_rollout_ref.actor.use_kl_loss": ("verl", "algorithm.kl_coef above 0"),
    "actor_rollout_ref.actor.kl_loss_coef": ("verl", "algorithm.kl_coef"),
    "actor_rollout_ref.actor.kl_loss_type": ("verl", "algorithm.kl_estimator (low_var_kl is k3)"),
    "actor_rollout_ref.actor.entropy_coeff": ("verl", "algorithm.entropy_coeff"),
    "actor_rollout_ref.actor.clip_ratio_low": ("verl", "algorithm.clip_ratio_low"),
    "actor_rollout_ref.actor.clip_ratio_c": ("verl", "algorithm.loss_options.clip_ratio_c"),
    "actor_rollout_ref.actor.clip_ratio_high": ("verl", "algorithm.clip_ratio_high"),
    "actor_rollout_ref.actor.loss_agg_mode": ("verl", "algorithm.loss_agg"),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("verl", "algorithm.loss_mode"),
    "actor_rollout_ref.actor.fsdp_config.param_offload": ("verl", "nothing yet (no offload)"),
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": ("verl", "nothing yet (no offload)"),
    "actor_rollout_ref.rollout.name": ("verl", "nothing: the generators are vLLM"),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ("verl", "generator.tensor_parallel_size"),
    "actor_rollout_ref.rollout.gpu_memory_utilization": ("verl", "generator.gpu_memory_utilization"),
    "actor_rollout_ref.rollout.temperature": ("verl", "generator.sampling.temperature"),
    "actor_rollout_ref.rollout.top_p": ("verl", "generator.sampling.top_p"),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": ("verl", "learner.micro_batch_size"),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": ("verl", "reference.micro_batch_size"),
    "actor_rollout_ref.ref.fsdp_config.param_offload": ("verl", "nothing yet (no offload)"),
    "reward_model.enable": ("verl", "reward_model.model (a model there turns it on)"),
    "reward_model.model.path": ("verl", "reward_model.model"),
    "reward_model.micro_batch_size_per_gpu": ("verl", "reward_model.micro_batch_size"),
    "algorithm.use_kl_in_reward": ("verl", "nothing: the KL term is in the loss (algorithm.kl_coef)"),
    "trainer.critic_warmup": ("verl", "nothing: GRPO has no critic"),
    "policy.model_name": ("NeMo RL", "model.path"),
    "policy.train_global_batch_size": ("NeMo RL", "learner.mini_batch_size"),
    "policy.train_micro_batch_size": ("NeMo RL", "learner.micro_batch_size"),
    "policy.generation.temperature": ("NeMo RL", "generator.sampling.temperature"),
    "policy.generation.max_new_tokens": ("NeMo RL", "generator.sampling.max_tokens"),
    "policy.optimizer.kwargs.lr": ("NeMo RL", "learner.optim.lr"),
    "grpo.num_prompts_per_step": ("NeMo RL", "data.train_batch_size"),
    "grpo.num_generations_per_prompt": ("NeMo RL", "algorithm.group_size"),
    "grpo.max_num_steps": ("NeMo RL", "trainer.total_steps"),
    "grpo.val_period": ("NeMo RL", "trainer.test_freq"),
    "loss_fn.reference_policy_kl_penalty": ("NeMo RL", "algorithm.kl_coef"),
    "checkpointing.checkpoint_dir": ("NeMo RL", "trainer.output_dir"),
    "checkpointing.save_period": ("NeMo RL", "trainer.save_freq"),
    "cluster.gpus_per_node": ("NeMo RL", "cluster.devices_per_node"),
    "cluster.num_nodes": ("NeMo RL", "cluster.nodes"),
    "data.dataset_name": ("NeMo RL", "data.train_files (hf://<dataset>?split=train)"),
}
"""Keys a verl or NeMo RL user types, and ours: said when such a key is refused as unknown."""
ALIASES = {("trainer", "logger"): "loggers", ("algorithm", "clip_ratio_c"): "loss_options.clip_ratio_c"}
"""verl's spellings (and our own earlier ones) taken as ours: (section, key) -> our key in that section."""


def _leaf_keys(node: DictConfig, prefix: str):
    for k in node.keys():
        child = node._get_node(k)
        if isinstance(child, DictConfig):
            yield from _leaf_keys(child, f"{prefix}.{k}")
        else:
            yield f"{prefix}.{k}"


def _renamed(key: str) -> str:
    """A dotted key with verl's spelling of its last part replaced by ours (as _take_aliases does)."""
    section, _, rest = key.partition(".")
    return f"{section}.{ALIASES.get((section, rest), rest)}" if rest else key


def _field_type(key: str) -> Any:
    """The declared type of a dotted recipe key (None when it is not one)."""
    tp: Any = recipe_class()
    for part in key.split("."):
        if get_origin(tp) is dict:  # an entry of a mapping value
            tp = get_args(tp)[1]
        elif is_dataclass(tp) and part in _valid_keys(tp):
            tp = _valid_keys(tp)[part]
        else:
            return None
    return tp


def _reset(user: DictConfig, key: str, origin: str) -> list[str]:
    """Remove `key` from the recipe, so that its default applies; a problem for a key the recipe cannot have."""
    key = _renamed(key)
    if _field_type(key) is None:
        return check_keys(OmegaConf.from_dotlist([f"{key}=0"]), recipe_class(), origin) or [f"{origin}: no key {key!r}"]
    parent, _, last = key.rpartition(".")
    node = OmegaConf.select(user, parent) if parent else user
    if isinstance(node, DictConfig) and last in node:
        del node[last]
    return []


VERL_REWARD = "custom_reward_function"
VERL_REWARD_KEYS = ("path", "name", "reward_kwargs")


def _verl_reward(user: DictConfig, overrides: list[str], path: Path) -> tuple[DictConfig, list[str]]:
    """verl's custom_reward_function (its path, name and reward_kwargs, in the YAML or as overrides, in any order)
    taken as ours: reward.functions of one function, ``path:name`` (verl's default name, compute_score, when none
    is given), called with the kwargs. The overrides left."""
    given = user.pop(VERL_REWARD, None)
    if given is not None and not isinstance(given, DictConfig):
        raise RecipeError(f"{path}: {VERL_REWARD} is a section: set its keys ({', '.join(VERL_REWARD_KEYS)})")
    given, rest = given or OmegaConf.create({}), []
    for item in overrides:
        if item.removeprefix("+").startswith(VERL_REWARD + ".") and "=" in item:
            try:
                given = OmegaConf.merge(given, OmegaConf.from_dotlist([item.removeprefix("+")])[VERL_REWARD])
            except Exception as e:  # not valid YAML: said as any override's is
                raise RecipeError(f"override {item!r}: {e}") from None
        else:
            rest.append(item)
    if not given:
        return user, overrides
    unknown = [k for k in given if k not in VERL_REWARD_KEYS]
    if unknown or not given.get("path"):
        raise RecipeError(
            f"{VERL_REWARD}: "
            + (f"unknown key {unknown[0]!r}, " if unknown else "no path given, ")
            + f"expected {', '.join(f'{VERL_REWARD}.{k}' for k in VERL_REWARD_KEYS)} (verl's; ours: reward.functions "
            "of name path/to/file.py:function and its kwargs)"
        )
    function = {
        "name": f"{given.path}:{given.get('name') or 'compute_score'}",
        "kwargs": given.get("reward_kwargs") or {},
    }
    OmegaConf.update(user, "reward.functions", [function], merge=False)
    return user, rest


def _engine_range(user: DictConfig, path: Path) -> list[str]:
    """``generator.num_engines: min..max`` read as num_engines=min, max_engines=max (in place); a problem where the
    text is not such a range."""
    given = OmegaConf.select(user, "generator.num_engines")
    if not isinstance(given, str):
        return []
    found = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+)\s*)?", given)
    if not found:
        return [f"{path}: generator.num_engines={given!r}: expected a count of engines or a range min..max (2..4)"]
    OmegaConf.update(user, "generator.num_engines", int(found[1]))
    if found[2]:
        OmegaConf.update(user, "generator.max_engines", int(found[2]))
    return []


def _take_aliases(node: DictConfig) -> None:
    """Rename verl's spellings (trainer.logger) to ours in place."""
    for (section, key), ours in ALIASES.items():
        sub = node.get(section) if isinstance(node, DictConfig) else None
        if isinstance(sub, DictConfig) and key in sub:
            OmegaConf.update(sub, ours, sub[key])
            del sub[key]


def check_keys(node: Any, schema: type, origin: str, prefix: str = "") -> list[str]:
    """A message for every key of `node` that `schema` (a dataclass) does not have, and every value given where a
    section is; a single value where a list is expected becomes a list of it (verl's data.train_files=path)."""
    valid, problems = _valid_keys(schema), []
    for key in node.keys() if isinstance(node, DictConfig) else ():
        if key not in valid:
            problems.append(f"{origin}: unknown key {prefix + str(key)!r}{_hint(node, key, valid, prefix)}")
            continue
        tp = valid[key]
        child = node._get_node(key)
        wrong = _wrong_shape(child, tp, prefix + str(key))
        if wrong:
            problems.append(f"{origin}: {wrong}")
            continue
        if is_dataclass(tp) and not isinstance(child, DictConfig) and child._value() is not None:
            some = ", ".join(f"{prefix}{key}.{k}" for k in list(_valid_keys(tp))[:3])
            problems.append(f"{origin}: {prefix + str(key)!r} is a section, not a value: set its keys ({some}, ...)")
            continue
        if (
            get_origin(tp) is list
            and not isinstance(child, ListConfig)
            and child._value() is not None
            and not isinstance(child, DictConfig)
        ):
            node[key] = [child._value()]  # one value where a list is expected: a list of it
            child = node._get_node(key)
        if is_dataclass(tp) and isinstance(child, DictConfig):
            problems += check_keys(child, tp, origin, prefix + f"{key}.")
        elif get_origin(tp) is list and isinstance(child, ListConfig):
            (item_tp,) = get_args(tp)
            if is_dataclass(item_tp):
                for i, item in enumerate(child):
                    problems += check_keys(item, item_tp, origin, prefix + f"{key}[{i}].")
    return problems


def _shape_of(tp: Any, many: bool = False) -> str:
    """What a value of type `tp` looks like in YAML, as a user reads it (`many`: in the plural)."""
    tp = next((a for a in get_args(tp) if a is not type(None)), tp) if get_origin(tp) in (Union, UnionType) else tp
    if is_dataclass(tp):
        keys = ", ".join(list(_valid_keys(tp))[:3])
        return f"{'mappings' if many else 'a mapping'} of keys ({keys}, ...)"
    if get_origin(tp) is list:
        return f"{'lists' if many else 'a list'} of {_shape_of(get_args(tp)[0], many=True)}"
    if get_origin(tp) is dict:
        return "mappings (name: value)" if many else "a mapping (name: value)"
    return "values" if many else "a value"


def _wrong_shape(child: Any, tp: Any, key: str, item: bool = False) -> str | None:
    """A message when `child` is a mapping where `tp` wants a list or a value, a list where it wants a mapping or a
    value, or a list item of the wrong shape (`item`: a list's element, which is never made a list of one); None
    when the shape fits (the types are checked later)."""
    if get_origin(tp) in (Union, UnionType):
        tp = next((a for a in get_args(tp) if a is not type(None)), tp)
    if tp is Any or child._is_none():
        return None
    got = "a mapping" if isinstance(child, DictConfig) else "a list" if isinstance(child, ListConfig) else "a value"
    shown = f" ({str(OmegaConf.to_container(child) if got != 'a value' else child._value())[:60]})"
    wants = "list" if get_origin(tp) is list else "mapping" if is_dataclass(tp) or get_origin(tp) is dict else "value"
    if wants == "list" and isinstance(child, ListConfig):
        (item_tp,) = get_args(tp)
        for i in range(len(child)):
            wrong = _wrong_shape(child._get_node(i), item_tp, f"{key}[{i}]", item=True)
            if wrong:
                return f"{key} is {_shape_of(tp)}; {wrong}"
        return None
    if get_origin(tp) is dict and isinstance(child, DictConfig):
        for name in child.keys():
            wrong = _wrong_shape(child._get_node(name), get_args(tp)[1], f"{key}.{name}", item=True)
            if wrong:
                return wrong
        return None
    if wants == "list" and got == "a value" and not item:
        return None  # one value where a list is expected: check_keys makes a list of it
    if got.endswith(wants) or (wants == "mapping" and got == "a value" and not item):
        return None  # a value where a section is: check_keys says so, with the section's keys
    return f"{key}: expected {_shape_of(tp)}, got {got}{shown}"


def _hint(node: DictConfig, key: str, valid: dict, prefix: str) -> str:
    """What an unknown key is here: verl's or NeMo RL's name for one of ours, else a close spelling of ours."""
    full = prefix + str(key)
    child = node._get_node(key)
    leaves = list(_leaf_keys(child, full)) if isinstance(child, DictConfig) else [full]
    foreign = next((k for k in leaves if k in FOREIGN_KEYS), None)
    if foreign:
        framework, ours = FOREIGN_KEYS[foreign]
        return f"; {framework}'s {foreign} is {ours} here"
    close = [prefix + c for c in difflib.get_close_matches(str(key), list(valid), n=1, cutoff=0.75)]
    close = close or difflib.get_close_matches(full, _all_paths(recipe_class()), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


# --- writing -------------------------------------------------------------------------------

SECRET_KEY = re.compile(r"(^|[_-])token$|secret|passw(or)?d|api[_-]?key|credential", re.I)
REDACTED = "***redacted***"


def secret_values() -> list[str]:
    """Values of environment variables whose names look secret (HF_TOKEN, WANDB_API_KEY, ...)."""
    return [v for k, v in os.environ.items() if SECRET_KEY.search(k) and len(v) >= 6]


def redact(obj: Any, secrets: list[str] | None = None) -> Any:
    """A copy of plain data with secret-looking keys and any secret env value masked."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(obj, dict):
        return {
            k: REDACTED if SECRET_KEY.search(str(k)) and obj[k] not in (None, "", {}, []) else redact(v, secrets)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact(v, secrets) for v in obj]
    if isinstance(obj, str):
        for s in secrets:
            obj = obj.replace(s, REDACTED)
    return obj


def recipe_dict(r: Recipe) -> dict:
    """The resolved recipe as plain data (interpolations resolved)."""
    return OmegaConf.to_container(OmegaConf.structured(r), resolve=True)


def recipe_yaml(r: Recipe) -> str:
    """The resolved recipe as YAML, secrets redacted: what config.yaml holds."""
    return OmegaConf.to_yaml(OmegaConf.create(redact(recipe_dict(r))))


def dump_recipe(r: Recipe, path: str | os.PathLike) -> Path:
    """Write the resolved, redacted recipe as YAML to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(recipe_yaml(r))
    return path
