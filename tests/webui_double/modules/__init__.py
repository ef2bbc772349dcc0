"""Test double of the AUTOMATIC1111 stable-diffusion-webui 1.10.1 ``modules`` package.

Only the surface an AlwaysVisible extension script touches is reproduced; see ../README.md.
"""
