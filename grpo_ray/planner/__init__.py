"""``grpo-ray plan``: will a recipe fit, and how long will a step take, before anything starts.

    memory, fit   one actor's memory per pool kind, and the check that adds them up per device
    work, speed   what a model call costs on measured rates, and a step's phases under the schedule
    rates         the rates, calibrated here or from the committed table
    suggest       the layouts a recipe allows, predicted and ranked
    calibrate     ``plan --calibrate``: measure this machine's rates (the parts in ``measure``, each in a child)

The runtime never imports this package (``tests/test_structure.py``): it reads the recipe's facts from
``grpo_ray.lengths`` and the schedule's rules from ``grpo_ray.schedule``, as the planner does.
"""
