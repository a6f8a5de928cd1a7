"""AMD Instinct MI355X x 4. Minimal: the hardware keys the GPU stack needs; the recipe keys come
from the hardware-recipes branch."""

gpu_model = "MI355X"
gpu_count = 4
nvswitch = False
