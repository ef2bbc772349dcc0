"""A small test double of Stable Diffusion WebUI Forge (main at dfdcbab); see README.md."""
