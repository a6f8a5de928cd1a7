"""pyinfra facts gpuserve reads from hosts, each beside the pure parser it uses."""
