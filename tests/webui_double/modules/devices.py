"""Double of modules/devices.py (WebUI 1.10.1): CPU only."""

import contextlib

import torch

cpu = torch.device("cpu")
device = cpu
dtype = torch.float32
dtype_vae = torch.float32
dtype_unet = torch.float32
unet_needs_upcast = False


class NansException(Exception):
    # mirrors modules/devices.py NansException ~L238
    pass


def test_for_nans(x, where):
    # mirrors modules/devices.py test_for_nans ~L242-265: only the FIRST element is checked
    from modules import shared

    if shared.cmd_opts.disable_nan_check:
        return
    if not torch.isnan(x[(0,) * len(x.shape)]):
        return
    if where == "unet":
        message = "A tensor with NaNs was produced in Unet."
    elif where == "vae":
        message = "A tensor with NaNs was produced in VAE."
    else:
        message = "A tensor with NaNs was produced."
    message += " Use --disable-nan-check commandline argument to disable this check."
    raise NansException(message)


def torch_gc():
    pass


def autocast(disable=False):
    return contextlib.nullcontext()


def without_autocast(disable=False):
    return contextlib.nullcontext()
