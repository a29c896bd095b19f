"""Pure functions of GRPO: tensors in, tensors and metrics out; no Ray, no I/O."""
