"""Example production fleet. Host names are placeholders: replace them with yours.

Each list is a pyinfra group whose group_data/<name>.py declares the hardware (and so the recipe);
every host is also in group ``prod`` (this file's name), whose group_data/prod.py pins the model.
"""

hopper_x8 = [
    "gpu-h200-01.prod.example",
    "gpu-h200-02.prod.example",
    "gpu-h200-03.prod.example",
]

# PLACEHOLDER indexes, like the host names: replace them with your mirrors. vLLM 0.34.0 (the
# Blackwell and AMD pin) requires flashinfer-python==0.7.3, which PyPI does not have, and AMD
# hosts need vLLM's ROCm wheels; without an index the plan refuses these hosts
# (docs/recipes.md, "Engine pins").
blackwell_x4 = [
    ("gpu-gb200-01.prod.example",
     {"engine_index": "https://wheels.prod.example/flashinfer/simple"}),
]

mi355x_x4 = [
    ("gpu-mi355x-01.prod.example",
     {"engine_index": "https://wheels.prod.example/vllm-rocm/simple"}),
]
