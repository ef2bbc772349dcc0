"""Double of modules/shared_options.py (WebUI 1.10.1): only the options the double reads.

Names, defaults and ``infotext=`` labels are those of the real ``options_templates``
(line numbers of the real file in comments). There is no ``token_merging_random`` option in 1.10.1:
the built-in ToMe always uses ``use_rand=False`` (modules/sd_models.py ~L1028).
"""

from modules.options import OptionInfo


def templates():
    """A fresh dict of OptionInfo (new objects each call, so tests can reset options)."""
    return {
        # ~L35-62 saving / grids
        "samples_save": OptionInfo(True, "Always save all generated images"),
        "grid_save": OptionInfo(True, "Always save all generated image grids"),
        "grid_only_if_multiple": OptionInfo(True, "Do not save grids consisting of one picture"),
        "save_images_before_highres_fix": OptionInfo(False, "Save a copy of image before applying highres fix."),
        "img_max_size_mp": OptionInfo(200, "Maximum image size"),
        # ~L111-112 face restoration
        "face_restoration": OptionInfo(False, "Restore faces", infotext="Face restoration"),
        "face_restoration_model": OptionInfo("CodeFormer", "Face restoration model"),
        # ~L171-253 stable diffusion / optimizations
        "sd_model_checkpoint": OptionInfo(None, "Stable Diffusion checkpoint"),
        "hires_fix_refiner_pass": OptionInfo(
            "second pass", "Hires fix: which pass to enable refiner for", infotext="Hires refiner"
        ),  # ~L185
        "refiner_switch_by_sample_steps": OptionInfo(
            False,
            "Switch to refiner by sampling steps instead of model timesteps. Old behavior for refiner.",
            infotext="Refiner switch by sampling steps",
        ),  # ~L256
        "CLIP_stop_at_last_layers": OptionInfo(1, "Clip skip", infotext="Clip skip"),
        "randn_source": OptionInfo("GPU", "Random number generator source.", infotext="RNG"),
        "tiling": OptionInfo(False, "Tiling", infotext="Tiling"),
        "sd_vae": OptionInfo("Automatic", "SD VAE"),
        "sd_vae_encode_method": OptionInfo("Full", "VAE type for encode", infotext="VAE Encoder"),
        "sd_vae_decode_method": OptionInfo("Full", "VAE type for decode", infotext="VAE Decoder"),
        "inpainting_mask_weight": OptionInfo(
            1.0, "Inpainting conditioning mask strength", infotext="Conditional mask weight"
        ),
        "initial_noise_multiplier": OptionInfo(1.0, "Noise multiplier for img2img", infotext="Noise multiplier"),
        "img2img_extra_noise": OptionInfo(
            0.0, "Extra noise multiplier for img2img and hires fix", infotext="Extra noise"
        ),
        "img2img_fix_steps": OptionInfo(False, "With img2img, do exactly the amount of steps the slider specifies."),
        "s_min_uncond": OptionInfo(0.0, "Negative Guidance minimum sigma", infotext="NGMS"),
        "s_min_uncond_all": OptionInfo(False, "Negative Guidance minimum sigma all steps", infotext="NGMS all steps"),
        # ~L236-238: the three built-in token merging options (no "random" option exists)
        "token_merging_ratio": OptionInfo(0.0, "Token merging ratio", infotext="Token merging ratio"),
        "token_merging_ratio_img2img": OptionInfo(0.0, "Token merging ratio for img2img"),
        "token_merging_ratio_hr": OptionInfo(
            0.0, "Token merging ratio for high-res pass", infotext="Token merging ratio hr"
        ),
        "pad_cond_uncond": OptionInfo(False, "Pad prompt/negative prompt", infotext="Pad conds"),
        "pad_cond_uncond_v0": OptionInfo(False, "Pad prompt/negative prompt (v0)", infotext="Pad conds v0"),
        "persistent_cond_cache": OptionInfo(True, "Persistent cond cache"),
        "batch_cond_uncond": OptionInfo(True, "Batch cond/uncond"),
        "auto_backcompat": OptionInfo(True, "Automatic backward compatibility"),
        "use_old_hires_fix_width_height": OptionInfo(
            False, "For hires fix, use width/height sliders to set final resolution"
        ),
        "hires_fix_use_firstpass_conds": OptionInfo(
            False, "For hires fix, calculate conds of second pass using extra networks of first pass."
        ),
        # ~L307-380 UI / infotext
        "return_grid": OptionInfo(True, "Show grid in gallery"),
        "enable_pnginfo": OptionInfo(True, "Write infotext to metadata of the generated image"),
        "add_model_name_to_info": OptionInfo(True, "Add model name to infotext"),
        "add_model_hash_to_info": OptionInfo(True, "Add model hash to infotext"),
        "add_vae_name_to_info": OptionInfo(True, "Add VAE name to infotext"),
        "add_vae_hash_to_info": OptionInfo(True, "Add VAE hash to infotext"),
        "add_user_name_to_info": OptionInfo(False, "Add user name to infotext when authenticated"),
        "add_version_to_infotext": OptionInfo(True, "Add program version to infotext"),
        "infotext_skip_pasting": OptionInfo([], "Disregard fields from pasted infotext"),
        "infotext_styles": OptionInfo("Apply if any", "Infer styles from prompts of pasted infotext"),
        "live_previews_enable": OptionInfo(True, "Show live previews of the created image"),
        "show_progress_every_n_steps": OptionInfo(10, "Live preview display period"),
        "live_preview_content": OptionInfo("Prompt", "Live preview subject"),
        "hide_samplers": OptionInfo([], "Hide samplers in user interface"),
        # ~L392-407 sampler parameters
        "s_churn": OptionInfo(0.0, "sigma churn", infotext="Sigma churn"),
        "s_tmin": OptionInfo(0.0, "sigma tmin", infotext="Sigma tmin"),
        "s_tmax": OptionInfo(0.0, "sigma tmax", infotext="Sigma tmax"),
        "s_noise": OptionInfo(1.0, "sigma noise", infotext="Sigma noise"),
        "eta_noise_seed_delta": OptionInfo(0, "Eta noise seed delta", infotext="ENSD"),
        "always_discard_next_to_last_sigma": OptionInfo(
            False, "Always discard next-to-last sigma", infotext="Discard penultimate sigma"
        ),
        "sgm_noise_multiplier": OptionInfo(False, "SGM noise multiplier", infotext="SGM noise multiplier"),
        "skip_early_cond": OptionInfo(0.0, "Ignore negative prompt during early sampling", infotext="Skip Early CFG"),
    }
