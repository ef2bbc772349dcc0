"""Doubles of third-party extensions that change the UNet ToMe patches (see README.md): what each does to the model,
written from reading its source."""
