"""pyinfra facts gpuserve reads from hosts: FactBase classes over pure, unit-tested parsers."""
