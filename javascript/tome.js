// Generated from tome_core/settings.py by `python -m webui_tome.extension`; do not edit.
(function () {
    const hints = {
        "enabled": "Merge redundant tokens in the UNet's transformer blocks for this generation.",
        "ratio": "Fraction of tokens merged away before self-attention: higher is faster and less faithful; 0.3-0.5 for the first pass. At most 1 - 1/(stride x * stride y). Not used by the downsample method.",
        "max_downsample": "Merge (or downsample) in the UNet levels downsampled at most this much. auto: the highest-resolution level that has transformer blocks (1 for SD1/SD2, 2 for SDXL).",
        "sx": "Width of the cells that each keep one destination token. Larger strides allow higher ratios (at most 1 - 1/(stride x * stride y)).",
        "sy": "Height of the cells that each keep one destination token. Larger strides allow higher ratios (at most 1 - 1/(stride x * stride y)).",
        "use_rand": "Pick each cell's destination token at random (reproducible from the seed) instead of the top-left one.",
        "seed": "Seed of the random destinations; -1 (the default) derives it from the image seed.",
        "merge_attn": "Merge tokens before self-attention (the main speed-up).",
        "merge_crossattn": "Also merge before cross-attention (little gain, some quality loss).",
        "merge_mlp": "Also merge before the feed-forward layer (little gain, noticeable quality loss).",
        "hires_ratio": "Merge ratio of the hires. fix pass, where ToMe gains most; 0 (the default) uses the merge ratio. At most 1 - 1/(stride x * stride y).",
        "min_size": "Token merging stays off for a pass whose shorter image side is below this many pixels (e.g. 768: only the hires. fix pass is merged; the step cache still runs); 0 (the default): always on. The gain is nil around 512 px.",
        "merge_controlnet": "Also merge tokens inside the active ControlNet models, with the same settings.",
        "method": "merge: the paper's token merging (ratio, strides, random destinations, merge targets, plan reuse). downsample: keep every query, downsample keys and values by the downsample factor (ToDo); faster and more faithful, recommended for SDXL and 1024 px and more.",
        "downsample_factor": "downsample method only: keys and values are subsampled by this factor per side at the highest-resolution level with transformer blocks, halved per level below it.",
        "start": "ToMe is active from this fraction of the sampling steps on (0: from the first step).",
        "end": "ToMe is active until this fraction of the sampling steps (e.g. 0.7: off for the last 30%, which draw fine detail).",
        "share_plan": "Compute the merge plan once per UNet level and forward, and reuse it in that level's other blocks (faster, slightly less faithful).",
        "plan_interval": "Recompute the merge plans every this many sampling steps and reuse them in between (1: every step, exact).",
        "cache": "Reuse the UNet's deep features between steps (DeepCache): every N-th step runs in full, the steps between run only the shallowest skip branch (on FLUX, Chroma and Wan: the first block, and the later blocks' residual is forecast). Stacks with token merging; with ratio 0 it runs alone. Under Euler a and the SDE samplers (fresh noise every step) any step cache changes the image much more: use interval 2 there, or leave it off.",
        "cache_interval": "Run the full UNet every this many steps and reuse its deep features in between (1: every step is full, no caching). Higher is faster and less faithful.",
        "cache_branch": "The skip branch that keeps running on cached steps: 0 (the default) is the shallowest and fastest; deeper branches run more of the UNet (more faithful, slower). SD1/SD2 have 12 branches, SDXL 9. On a diffusion transformer it is the number of blocks a cached step still runs, minus one (FLUX and Chroma: of the double-stream blocks).",
        "cache_start": "Cached steps may occur from this fraction of the sampling on; before it every step is full (the first step always is).",
        "cache_end": "Cached steps may occur until this fraction of the sampling; after it every step is full (the last step always is).",
        "hires_cache_interval": "Cache interval of the hires. fix pass; 0 (the default) uses the cache interval.",
        "cache_forecast": "What cached steps use for the deep features. auto (the default): calibrated on UNets (SD1, SD2, SDXL), linear on diffusion transformers (FLUX, Chroma, Wan), each the one measured best there. calibrated: their extrapolation from the last two full steps, to the place on that line the live shallow features say (more faithful than DeepCache at the same speed, also under Euler a and the SDE samplers). linear: the same line, placed by the sampler's time (loses to DeepCache under Euler a and the SDE samplers). off: the last full step's, unchanged (DeepCache).",
        "cache_schedule": "auto (the default): time on UNets, uniform on diffusion transformers (their flow-matching schedules bunch the time where the image forms least). time: full steps spread evenly in the sampler's time, on average one every cache interval (the same as uniform on Euler's, DDIM's and UniPC's spacing; under the Karras and exponential schedules of DPM++ they go where the image forms). uniform: a full step every cache interval (DeepCache). early: the same number of full steps with the second one step sooner (at cache interval - 1, then every cache interval), where the steps before it have no forecast yet (from cache interval 3): on the trained transformers the worst image kept up to 9 dB more, the mean -2.4 to +1.5 dB (not measured on UNets). adaptive: also a full step as soon as the UNet's input strays from its forecast by more than the cache threshold; the cache interval is then the longest run without one.",
        "cache_threshold": "adaptive schedule only: how far (relative L1) the UNet's input may stray from its forecast before a full step; lower is more faithful and slower, 0 makes every step full.",
        "cache_device": "Where the cache keeps what it carries between steps (the skipped blocks' result and its change: two per stream, about 0.8 GB each for Wan 14B at 720p x 81 frames). model (the default): on the model's device. cpu: in CPU memory, copied back (non-blocking) as each cached step begins; the same image, less GPU memory, a copy per cached step.",
        "cache_correction": "Diffusion transformers under Euler and the linear multistep samplers (DPM++ 2M, DEIS, res_multistep, UniPC; ComfyUI, Forge Neo, diffusers): at each full step the cached steps since the last one are re-estimated from the full steps around them, and the full step's output (under a multistep sampler, also the next few) carries this much of the difference. 0.75 (the default) kept more than the uncorrected cache at every cache interval on the FLUX and Wan layouts measured under Euler, within 0.3 dB of the best gain (1 at cache interval 3); 0: off. Under ancestral and SDE samplers, on UNets, or where the host does not give its sampler (A1111, Forge), it stays off; quietly at the default, with a ToMe note at any other value. It keeps three full steps' deep features and each cached step's shallow ones until the next full step (with cache device cpu, in CPU memory)."
    };
    function addTitles() {
        for (const tab of ['txt2img', 'img2img']) {
            for (const [name, hint] of Object.entries(hints)) {
                const el = gradioApp().getElementById(`script_${tab}_tome_${name}`);
                if (el && !el.title) el.title = hint;
            }
        }
    }
    onUiLoaded(addTitles);
    // gradio 3 rebuilds a control whose interactivity changes (the method greys some out): title it again
    onAfterUiUpdate(addTitles);
})();
