"""Example production fleet. Host names are placeholders: replace them with yours.

Each list is a pyinfra group whose group_data/<name>.py declares the hardware (and so the recipe);
every host is also in group ``prod`` (this file's name), whose group_data/prod.py pins the model.
"""

hopper_x8 = [
    "gpu-h200-01.prod.example",
    "gpu-h200-02.prod.example",
    "gpu-h200-03.prod.example",
]

blackwell_x4 = [
    "gpu-gb200-01.prod.example",
]

mi355x_x4 = [
    "gpu-mi355x-01.prod.example",
]
