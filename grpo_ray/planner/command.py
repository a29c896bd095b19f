"""``grpo-ray plan``: the command (its arguments are the CLI's table, ``grpo_ray.cli``)."""

from __future__ import annotations

from grpo_ray.errors import UserError


def plan_command(args) -> int:
    """``grpo-ray plan RECIPE``: placement, memory per device and the predicted step time (0: it fits)."""
    from grpo_ray.config import load_recipe
    from grpo_ray.planner.calibrate import has_gpu

    counts = {"--nodes": args.nodes, "--prompt-tokens": args.prompt_tokens, "--response-tokens": args.response_tokens}
    for flag, value in counts.items():
        if value is not None and value < 1:
            raise UserError(f"plan {flag} {value}: must be 1 or more")
    flags = list(args.overrides)
    if args.gpu == "cpu":
        flags += ["cluster.device=cpu", "cluster.devices_per_node=0", "cluster.gpu=''"]
    elif args.gpu:
        flags += ["cluster.device=cuda", f"cluster.gpu={args.gpu}", "cluster.device_memory_gb=0"]
    if args.nodes is not None:
        flags.append(f"cluster.nodes={args.nodes}")
    recipe = load_recipe(args.recipe, flags, command=args.job)
    if args.calibrate and recipe.cluster.device == "cuda" and not has_gpu():
        raise UserError(
            f"plan --calibrate measures this machine's {recipe.cluster.device}, and it has no GPU: calibrate on one of "
            "the GPU machines, or plan with --gpu cpu"
        )
    from grpo_ray.lengths import response_budget

    for flag, value, limit, key in (
        ("--prompt-tokens", args.prompt_tokens, recipe.data.max_prompt_length, "data.max_prompt_length"),
        ("--response-tokens", args.response_tokens, response_budget(recipe), "response budget"),
    ):
        if value and value > limit:
            raise UserError(f"plan {flag} {value}: over the recipe's {key} ({limit}); the run never sees one that long")
    c = recipe.cluster
    kind = f"{c.devices_per_node} x {c.gpu or 'GPU'}" if c.device == "cuda" else "CPU"
    print(f"{args.recipe}: {recipe.model.path} on {c.nodes} node(s) of {kind}")
    from grpo_ray.models.dims import model_dims
    from grpo_ray.planner.fit import check, model_limits

    dims = model_dims(recipe.model.path)
    model_limits(recipe, args.job, dims)
    report = check(recipe, dims, args.job)
    print(report.text())
    if args.job == "train":
        print(_plan_speed(recipe, dims, args, flags))
    return 0 if report.fits else 1


def _plan_speed(recipe, dims, args, flags: list[str]) -> str:
    """The predicted step time (``grpo_ray.planner.speed``), on rates calibrated now (--calibrate), earlier, or
    published; with --suggest, the fastest layouts that fit."""
    from grpo_ray.config import load_recipe
    from grpo_ray.planner import rates, speed, suggest

    if args.calibrate:
        from grpo_ray.planner.calibrate import calibrate

        device = recipe.cluster.device
        how_long = "about 3 minutes on 2 CPU cores" if device == "cpu" else "a few minutes"
        print(f"calibrating this machine's {device} ({how_long}) ...")
        _, path = calibrate(device)
        print(f"  rates written to {path}")
    known = rates.rates_for(recipe)
    if known is None:
        return (
            f"no time prediction: no rates for {recipe.cluster.gpu or recipe.cluster.device} (run grpo-ray plan "
            "--calibrate on one of its machines, or name a GPU of the published table: "
            f"{', '.join(rates.published())})"
        )
    shape = speed.default_shape(recipe, args.prompt_tokens or 0, args.response_tokens or 0)
    now = speed.predict(recipe, dims, known, shape)
    text = now.text() + _state_copy_text(recipe, dims, now.step)
    if not args.suggest:
        return text
    c = recipe.cluster
    devices = args.suggest if args.suggest > 0 else (c.nodes * c.devices_per_node if c.device == "cuda" else 0)
    found = suggest.suggest(lambda more: load_recipe(args.recipe, flags + more), recipe, dims, known, shape, devices)
    return text + "\n" + suggest.suggestions_text(now, found)


def _state_copy_text(recipe, dims, step: float) -> str:
    """trainer.fault_tolerance=all: what the learner's copy of its state costs a step (``memory.state_copy``), on
    the host memory bandwidth measured on this project's CPU machine (a GPU node's host assumed no slower)."""
    from grpo_ray.planner import memory, rates

    host = rates.published()["cpu"].at(1).bandwidth / 1e9
    gb, seconds = memory.state_copy(dims, recipe, host)
    if not gb:
        return ""
    link = f"at {host:.0f} GB/s" if recipe.cluster.device == "cpu" else f"at an assumed {memory.D2H_GBPS:.0f} GB/s"
    return (
        f"\n  state copy   {seconds:9.3f} s  trainer.fault_tolerance=all: {gb:.3g} GB a learner rank as each step "
        f"starts, to the host {link}, then into Ray's object store at {host:.0f} GB/s; it holds the rank before its "
        f"update, {100 * seconds / step:.1f}% of the step above at most (not in it)"
    )
