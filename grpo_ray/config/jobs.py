"""The sections one job alone reads: ``sft`` (grpo-ray sft) and ``rm`` (grpo-ray rm)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SFTConfig:
    target_key: str = "extra_info.answer"
    """Dotted key of each row's target: the whole response the model is taught (GSM8K's worked solution is
    extra_info.answer after prepare-data). The end-of-sequence token is appended."""
    max_target_length: int = 512
    """Longest target in tokens (end of sequence included); longer rows are dropped and counted."""


@dataclass
class RMConfig:
    chosen_key: str = "chosen"
    """Dotted key of each preference row's preferred response (text, or the conversation as messages whose last
    is the assistant's answer: TRL's and OpenRLHF's layouts)."""
    rejected_key: str = "rejected"
    """Dotted key of the response it is preferred to."""
    label_key: str = ""
    """Pointwise rows instead of pairs: the dotted key of each row's label (1 good, 0 bad, or a probability
    between), with the response at response_key; empty: rows are preference pairs."""
    response_key: str = "response"
    """Dotted key of a pointwise row's response (read with label_key only)."""
    max_length: int = 1024
    """Longest rendered conversation in tokens (prompt and response in the model's chat template); rows with a
    longer one are dropped and counted."""
