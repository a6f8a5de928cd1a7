"""What the machine is: its groups (exactly one hardware group, or role groups only: gateway,
monitor), its GPUs, the recipe they select and the GPU stack layer's keys (gpuserve.stack)."""

from __future__ import annotations

from gpuserve import gateway, monitoring, recipes, stack
from gpuserve.config.sources import _Checker, data_source
from gpuserve.hardware import GPU_MODELS, HardwareProfile
from gpuserve.values import finite_problem, scale_hint

ROLE_GROUPS = (gateway.GATEWAY_GROUP, monitoring.MONITOR_GROUP)

GPU_MEMORY_MAX_GIB = 1024   # per GPU: well above any GPU made; 81920 is 80 GiB given in MiB


def _hardware(c: _Checker) -> HardwareProfile | None:
    model = c.get("gpu_model")
    ok = True
    if model is not None and not isinstance(model, str):   # a list or a dict: no hash to look up
        c.problem("gpu_model", f"{model!r} is not allowed; gpu_model is one GPU model's name (a "
                  f"string), one of {', '.join(GPU_MODELS)}")
        model, ok = "", False
    elif model not in GPU_MODELS:
        c.problem("gpu_model", f"unknown GPU model {model!r}; gpuserve knows "
                  f"{', '.join(GPU_MODELS)}" + ("" if model is not None else " (it is not set)"))
        ok = False
    count = c.integer("gpu_count", 0)
    if count is not None and model == "cpu" and count != 0:
        c.problem("gpu_count", f"{count} GPUs with gpu_model 'cpu'; a CPU host has gpu_count 0")
        ok = False
    elif count == 0 and model in GPU_MODELS and model != "cpu":
        c.problem("gpu_count", f"0 GPUs with gpu_model {model!r}; use gpu_model 'cpu' for hosts "
                  "without GPUs")
        ok = False
    nvswitch = c.get("nvswitch")
    if not isinstance(nvswitch, bool):
        c.problem("nvswitch", f"{nvswitch!r} is not allowed; use True or False")
        ok = False
    memory = c.get("gpu_memory_gib")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, float))
                               or finite_problem(memory) or not 0 < memory <= GPU_MEMORY_MAX_GIB):
        c.problem("gpu_memory_gib", f"{memory!r} is not allowed; use the GiB of one GPU (> 0, at most "
                  f"{GPU_MEMORY_MAX_GIB})" + scale_hint("gpu_memory_gib", memory, 1, GPU_MEMORY_MAX_GIB))
        ok = False
    if not ok or count is None:
        return None
    return HardwareProfile(model, count, nvswitch, memory)


def _recipe(c: _Checker, hw: HardwareProfile | None) -> tuple[str | None, bool]:
    explicit = c.get("recipe")
    if explicit is not None:
        return c.one_of("recipe", sorted(recipes.RECIPES)), True
    if hw is None:
        return None, False
    name = recipes.derive_recipe(hw.gpu_model, hw.gpu_count)
    if name is None:
        fits = [f"{m} x{n}" for (m, n) in recipes.RECIPE_FOR_HARDWARE if m == hw.gpu_model]
        c.problem("gpu_count", f"no recipe for {hw.gpu_count}x {hw.gpu_model}; recipes exist for "
                  f"{', '.join(fits)}; fix gpu_count or set recipe explicitly")
    return name, False


def _gpu_stack(c: _Checker) -> stack.StackSettings | None:
    try:
        return stack.settings_from(c.host.data)
    except stack.StackConfigError as exc:
        if not any(p.key == exc.key for p in c.problems):  # gpu_model etc. are checked above too
            c.problem(exc.key, exc.message, data_source(c.host, exc.key))
        return None


def _hardware_groups(c: _Checker) -> None:
    """A host is one machine: in at most one hardware group (pyinfra would let the later group's
    gpu_model win, and an 8x H200 box would be planned as 4x GB200)."""
    # (pyinfra lists a connector's host, @local, in each of its groups twice)
    hardware = [g for g in dict.fromkeys(c.host.groups) if g in recipes.RECIPES]
    if len(hardware) > 1:
        c.problem("gpu_model", f"the host is in the hardware groups {', '.join(hardware)}; put it "
                  "in exactly one (the group names what the machine is)",
                  f"groups {', '.join(hardware)}")


def _serves(c: _Checker) -> bool:
    """A host serves unless it is in a role group (gateway, monitor) and in no hardware group:
    then it runs its role and serves no model."""
    groups = tuple(c.host.groups)
    return not (any(g in ROLE_GROUPS for g in groups) and not any(g in recipes.RECIPES for g in groups))
