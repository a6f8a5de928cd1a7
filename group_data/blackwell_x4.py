"""GB200 x 4 (NVLink 5 switch fabric: fabric manager + nvlsm). Minimal: the hardware keys the GPU
stack needs; the recipe keys come from the hardware-recipes branch."""

gpu_model = "GB200"
gpu_count = 4
nvswitch = True
