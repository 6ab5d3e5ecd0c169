"""Training runs with the real frameworks, for tests/test_checkpoints_frameworks.py: run by the
torch interpreter (.venv-torch, see tests/torch_support.py), never imported by reconcile.

    python ckpt_frameworks.py LAYOUT OUT STEPS SAVE_EVERY RESULT.json [resume]

Each run trains a tiny model built from a config in code (nothing downloaded) on CPU, on data
made from the step number (so a resumed run sees what an uninterrupted one saw), saving a
checkpoint every SAVE_EVERY steps with the framework's own save, and writes to RESULT.json
{"start_step": the step the framework resumed at (0: from scratch), "losses": {step: loss}}.
With `resume`, it resumes by the framework's own rule: Trainer(resume_from_checkpoint=True),
Trainer.fit(ckpt_path="last"), DeepSpeedEngine.load_checkpoint(dir) (tag from `latest`),
Accelerator.load_state() (automatic checkpoint naming: the highest checkpoints/checkpoint_N).
CPU runs are deterministic: the losses of a resumed run equal an uninterrupted run's.
$CKPT_ZERO_STAGE sets DeepSpeed's ZeRO stage (default 0; 1 saves zero_pp_rank_*_optim_states.pt);
$CKPT_TOTAL_LIMIT Accelerate's total_limit.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
DIM, BATCH = 16, 4
DATA = 64  # batches in the data set, whatever the number of steps: a run of 8 steps and one of 10
# see the same first 8 batches (the samplers' permutations depend on the data set's length only)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, DIM, generator=g)
    return x, x.sum(dim=1, keepdim=True).tanh()


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def hf(out: str, steps: int, every: int, resume: bool) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return DATA * BATCH

        def __getitem__(self, i):
            ids = torch.Generator().manual_seed(i)
            t = torch.randint(0, 64, (12,), generator=ids)
            return {"input_ids": t, "labels": t}

    got: dict = {"losses": {}}

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            got["start_step"] = state.global_step

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs:
                got["losses"][str(state.global_step)] = logs["loss"]

    args = TrainingArguments(output_dir=out, max_steps=steps, save_steps=every, logging_steps=1,
                             per_device_train_batch_size=BATCH, learning_rate=1e-2, report_to=[], use_cpu=True,
                             seed=0, data_seed=0, dataloader_num_workers=0,
                             disable_tqdm=True, lr_scheduler_type="constant", warmup_steps=0)
    trainer = Trainer(model=model, args=args, train_dataset=Data(), callbacks=[Record()])
    trainer.train(resume_from_checkpoint=True if resume else None)
    return got


def lightning(out: str, steps: int, every: int, resume: bool) -> dict:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    got: dict = {"losses": {}}

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = mlp()

        def training_step(self, b, i):
            x, y = batch(self.global_step)
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            got["losses"][str(self.global_step + 1)] = float(loss)
            return loss

        def on_train_start(self):
            got["start_step"] = self.global_step

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(list(range(DATA)), batch_size=1)

    ckpt = ModelCheckpoint(dirpath=out, every_n_train_steps=every, save_top_k=-1, save_last=True)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[ckpt], logger=False,
                        enable_progress_bar=False, enable_model_summary=False, max_epochs=1)
    trainer.fit(Module(), ckpt_path="last" if resume else None)
    return got


def deepspeed_run(out: str, steps: int, every: int, resume: bool) -> dict:
    os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("MASTER_PORT", "29531")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    model = mlp()
    config = {"train_batch_size": BATCH, "optimizer": {"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}},
              "zero_optimization": {"stage": int(os.environ.get("CKPT_ZERO_STAGE", "0"))}, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    got: dict = {"losses": {}, "start_step": 0}
    if resume:
        path, _ = engine.load_checkpoint(out)
        got["start_step"] = engine.global_steps if path else 0
    for step in range(engine.global_steps, steps):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        got["losses"][str(step + 1)] = float(loss)
        if (step + 1) % every == 0:
            engine.save_checkpoint(out, tag=f"global_step{step + 1}")
    return got


def dcp_run(out: str, steps: int, every: int, resume: bool) -> dict:
    """torch.distributed.checkpoint, one process: `step-N` folders; on resume the step picked
    by torchtitan's rule (CheckpointManager._find_load_step: the highest step-N holding a
    .metadata), loaded with dcp.load (DCP itself has no rule of its own)."""
    import re

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    got: dict = {"losses": {}, "start_step": 0}
    start = 0
    if resume and os.path.isdir(out):
        found = [int(m.group(1)) for n in os.listdir(out) if (m := re.search(r"step-(\d+)", n))
                 and os.path.isfile(os.path.join(out, n, ".metadata"))]
        if found:
            start = max(found)
            x, y = batch(0)  # the optimizer's state must exist to be loaded into: one step made, then overwritten
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            msd, osd = get_state_dict(model, opt)
            sd = {"model": msd, "optim": osd}
            dcp.load(sd, checkpoint_id=os.path.join(out, f"step-{start}"))
            set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
            got["start_step"] = start
    for step in range(start, steps):
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        got["losses"][str(step + 1)] = float(loss)
        if (step + 1) % every == 0:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(out, f"step-{step + 1}"))
    return got


def accelerate_run(out: str, steps: int, every: int, resume: bool) -> dict:
    """Accelerate's automatic checkpoint naming: `out` is the project_dir, each save_state() makes
    checkpoints/checkpoint_<save count>/; on resume, load_state() without input_dir (Accelerate's
    own pick). The step and the next save count ride in a registered custom object, as a script
    must keep them (load_state restores neither); the input noise comes from torch's global RNG, so
    the random states saved (random_states_0.pkl) matter to the losses. $CKPT_TOTAL_LIMIT sets
    ProjectConfiguration.total_limit (save_state's cleanup of the oldest)."""
    import logging

    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    limit = os.environ.get("CKPT_TOTAL_LIMIT")
    config = ProjectConfiguration(project_dir=out, automatic_checkpoint_naming=True,
                                  total_limit=int(limit) if limit else None)
    accelerator = Accelerator(cpu=True, project_config=config)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    model, opt, sched = accelerator.prepare(model, opt, sched)

    class Progress:
        def __init__(self):
            self.step, self.saves = 0, 0

        def state_dict(self):
            return {"step": self.step, "saves": self.saves}

        def load_state_dict(self, sd):
            self.step, self.saves = sd["step"], sd["saves"]

    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    got: dict = {"losses": {}, "start_step": 0, "loaded_from": None}
    if resume:
        picked: list[str] = []

        class Picked(logging.Handler):  # load_state logs "[RANK 0] Loading states from <its pick>"
            def emit(self, record):
                said = record.getMessage()
                if "Loading states from " in said:
                    picked.append(said.split("Loading states from ", 1)[1])

        log = logging.getLogger("accelerate.accelerator")
        log.setLevel(logging.INFO)
        log.addHandler(Picked())
        accelerator.load_state()
        got["loaded_from"] = os.path.relpath(picked[-1], out)
        got["start_step"] = progress.step
        accelerator.project_configuration.iteration = progress.saves
    if not resume:
        torch.manual_seed(1)  # the global RNG from here on (a resumed run's comes from random_states_0.pkl)
    for step in range(progress.step, steps):
        x, y = batch(step)
        x = x + 0.1 * torch.randn(x.shape)  # from the global RNG: restored from random_states_0.pkl
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        sched.step()
        got["losses"][str(step + 1)] = float(loss)
        if (step + 1) % every == 0:
            progress.step, progress.saves = step + 1, accelerator.save_iteration + 1
            accelerator.save_state()
    return got


RUNS = {"dcp": dcp_run, "hf-trainer": hf, "lightning": lightning, "deepspeed": deepspeed_run,
        "accelerate": accelerate_run}

if __name__ == "__main__":
    layout, out, n, every, result = sys.argv[1:6]
    got = RUNS[layout](out, int(n), int(every), len(sys.argv) > 6 and sys.argv[6] == "resume")
    with open(result, "w") as fh:
        json.dump(got, fh)
