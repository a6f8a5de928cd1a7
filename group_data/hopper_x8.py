"""HGX H200 x 8 (NVSwitch baseboard). Minimal: the hardware keys the GPU stack needs; the recipe
keys come from the hardware-recipes branch."""

gpu_model = "H200"
gpu_count = 8
nvswitch = True
