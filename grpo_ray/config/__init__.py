"""The recipe: one typed config per section, loaded from YAML with ``a.b=c`` overrides.

``load_recipe(path, overrides)`` reads the YAML, applies the overrides, rejects
unknown keys (naming the key, where it came from and the closest valid key),
converts types, then checks the arithmetic between sections. Every problem is a
``RecipeError`` whose message says what to fix; the CLI prints it without a
traceback. ``dump_recipe`` writes the resolved recipe with secrets redacted.

The schema is ``config.schema`` (a new key is a typed field with a docstring there), the checks before start
``config.checks``, reading and writing ``config.load``.
"""

from grpo_ray.config.checks import (
    CHOICES,
    ENGINE_LORA_RANKS,
    FREE_TEXT,
    FUNCTION_KEYS,
    FUNCTION_NAME,
    GPU_MEMORY_GB,
    LOGGERS,
    engine_rank,
    loss_aggregation,
    notices,
    validate,
)
from grpo_ray.config.jobs import RMConfig, SFTConfig
from grpo_ray.config.load import SECRET_KEY, dump_recipe, load_recipe, recipe_dict, recipe_yaml, redact
from grpo_ray.config.pools import GENERATOR, KINDS, LEARNER, POOLS, REFERENCE, REWARD_MODEL, RULES, TEACHER, PoolKind
from grpo_ray.config.ranges import RANGES
from grpo_ray.config.schema import (
    AlgorithmConfig,
    ClusterConfig,
    DataConfig,
    EarlyStopConfig,
    EnvironmentConfig,
    FilterGroupsConfig,
    GeneratorConfig,
    LearnerConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    OverlongBufferConfig,
    Recipe,
    RecipeError,
    RolloutCorrectionConfig,
    SamplingConfig,
    TrainerConfig,
)
from grpo_ray.config.scorers import (
    JudgeConfig,
    ReferenceConfig,
    RewardConfig,
    RewardFnConfig,
    RewardModelConfig,
    ScorerConfig,
    TeacherConfig,
)

__all__ = [
    "JudgeConfig",
    "ScorerConfig",
    "GENERATOR",
    "LEARNER",
    "REFERENCE",
    "REWARD_MODEL",
    "RULES",
    "TEACHER",
    "CHOICES",
    "ENGINE_LORA_RANKS",
    "engine_rank",
    "FREE_TEXT",
    "FUNCTION_KEYS",
    "FUNCTION_NAME",
    "GPU_MEMORY_GB",
    "LOGGERS",
    "POOLS",
    "KINDS",
    "PoolKind",
    "RANGES",
    "SECRET_KEY",
    "AlgorithmConfig",
    "ClusterConfig",
    "DataConfig",
    "EarlyStopConfig",
    "EnvironmentConfig",
    "FilterGroupsConfig",
    "GeneratorConfig",
    "LearnerConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimizerConfig",
    "OverlongBufferConfig",
    "Recipe",
    "RecipeError",
    "ReferenceConfig",
    "TeacherConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RewardFnConfig",
    "RolloutCorrectionConfig",
    "RMConfig",
    "SFTConfig",
    "SamplingConfig",
    "TrainerConfig",
    "dump_recipe",
    "load_recipe",
    "loss_aggregation",
    "notices",
    "recipe_dict",
    "recipe_yaml",
    "redact",
    "validate",
]
