"""`make gpu-check`'s steps (benchmarks/gpu_check.py runs them): :mod:`~gpu_kit.config` the plan, :mod:`~gpu_kit.steps`
running a step, :mod:`~gpu_kit.probe` the environment, :mod:`~gpu_kit.models` the benchmarks, :mod:`~gpu_kit.workloads`
the workloads, :mod:`~gpu_kit.profile` and :mod:`~gpu_kit.sweeps` the profile, :mod:`~gpu_kit.summary` the summary."""
