"""Double of modules/shared_state.py (WebUI 1.10.1) State: the fields processing reads and writes.

``interrupt()``/``skip()``/``stop_generating()`` only set flags (~L76-86); they are honoured by the CFG
denoiser (raises InterruptedException, caught by the sampler) and by the batch loop of
process_images_inner. ``begin``/``end`` reset the flags like the real ones (~L110-150).
"""

import time


class State:
    def __init__(self):
        self.reset()

    def reset(self):
        self.skipped = False
        self.interrupted = False
        self.stopping_generation = False
        self.job = ""
        self.job_no = 0
        self.job_count = 0
        self.processing_has_refined_job_count = False
        self.job_timestamp = "0"
        self.sampling_step = 0
        self.sampling_steps = 0
        self.current_latent = None
        self.current_image = None
        self.textinfo = None
        self.time_start = None

    def skip(self):
        self.skipped = True

    def interrupt(self):
        self.interrupted = True

    def stop_generating(self):
        self.stopping_generation = True

    def nextjob(self):
        # mirrors State.nextjob ~L88-94 (live preview part left out)
        self.job_no += 1
        self.sampling_step = 0

    def begin(self, job: str = "(unknown)"):
        # mirrors State.begin ~L113-130
        self.sampling_step = 0
        self.time_start = time.time()
        self.job_count = -1
        self.processing_has_refined_job_count = False
        self.job_no = 0
        self.job_timestamp = time.strftime("%Y%m%d%H%M%S")
        self.current_latent = None
        self.current_image = None
        self.skipped = False
        self.interrupted = False
        self.stopping_generation = False
        self.textinfo = None
        self.job = job

    def end(self):
        self.job = ""
        self.job_count = 0
