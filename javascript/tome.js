// Generated from tome_core/settings.py by `python -m tome_core.extension`; do not edit.
(function () {
    const hints = {
        "enabled": "Merge redundant tokens in the UNet's transformer blocks for this generation.",
        "ratio": "Fraction of tokens merged away before self-attention. At most 1 - 1/(stride x * stride y). Higher is faster and less faithful.",
        "max_downsample": "Merge in the UNet levels downsampled at most this much. auto: the highest-resolution level that has transformer blocks (1 for SD1/SD2, 2 for SDXL).",
        "sx": "Width of the cells that each keep one destination token.",
        "sy": "Height of the cells that each keep one destination token.",
        "use_rand": "Pick each cell's destination token at random (reproducible from the seed) instead of the top-left one.",
        "seed": "Seed of the random destinations; -1 derives it from the image seed.",
        "merge_attn": "Merge tokens before self-attention (the main speed-up).",
        "merge_crossattn": "Also merge before cross-attention (little gain, some quality loss).",
        "merge_mlp": "Also merge before the feed-forward layer (little gain, noticeable quality loss).",
        "hires_ratio": "Merge ratio for the hires. fix pass; 0 uses the main ratio.",
        "min_size": "ToMe stays off while the shorter image side is below this many pixels; the gain is nil around 512 px.",
        "merge_controlnet": "Also merge tokens inside the active ControlNet models, with the same settings.",
        "method": "merge: the paper's token merging. downsample: keep every query, downsample keys and values (ToDo).",
        "downsample_factor": "downsample method: keys and values are pooled by this factor per side at the first level.",
        "start": "ToMe is active from this fraction of the sampling steps on.",
        "end": "ToMe is active until this fraction of the sampling steps (e.g. 0.7: off for the last 30%).",
        "share_plan": "Compute the merge plan once per UNet level and forward, and reuse it in that level's other blocks.",
        "plan_interval": "Reuse merge plans across this many consecutive sampling steps."
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
})();
