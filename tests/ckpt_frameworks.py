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


def diffusers_run(out: str, steps: int, every: int, resume: bool) -> dict:
    """The diffusers training examples' save and resume lines (examples/text_to_image/
    train_text_to_image.py main(), diffusers 0.42.1; the same in its LoRA, DreamBooth, ControlNet
    scripts), around a tiny UNet2DModel built in code: the save and load hooks write and read
    `unet/` (save_pretrained / from_pretrained), Accelerate the optimizer, the lr scheduler and the
    random states (`accelerator.save_state(os.path.join(args.output_dir, f"checkpoint-{global_step}"))`);
    `--resume_from_checkpoint latest`: the entries starting with `checkpoint`, sorted by
    int(x.split("-")[1]), the last; global_step = int(path.split("-")[1]). The noise comes from
    torch's global RNG, restored from random_states_0.pkl. $CKPT_TOTAL_LIMIT: --checkpoints_total_limit."""
    import shutil

    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    from diffusers import UNet2DModel
    from diffusers.optimization import get_scheduler

    limit = int(os.environ["CKPT_TOTAL_LIMIT"]) if os.environ.get("CKPT_TOTAL_LIMIT") else None
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=out))
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=1, out_channels=1, layers_per_block=1, block_out_channels=(8, 8),
                       down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"),
                       norm_num_groups=4)

    def save_model_hook(models, weights, output_dir):  # the example's hooks
        if accelerator.is_main_process:
            for model in models:
                model.save_pretrained(os.path.join(output_dir, "unet"))
                weights.pop()

    def load_model_hook(models, input_dir):
        for _ in range(len(models)):
            model = models.pop()
            load_model = UNet2DModel.from_pretrained(input_dir, subfolder="unet")
            model.register_to_config(**load_model.config)
            model.load_state_dict(load_model.state_dict())
            del load_model

    accelerator.register_save_state_pre_hook(save_model_hook)
    accelerator.register_load_state_pre_hook(load_model_hook)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-2)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=2, num_training_steps=64)
    unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    got: dict = {"losses": {}, "start_step": 0, "loaded_from": None}
    global_step = 0
    if resume:
        dirs = os.listdir(out) if os.path.isdir(out) else []
        dirs = [d for d in dirs if d.startswith("checkpoint")]
        dirs = sorted(dirs, key=lambda x: int(x.split("-")[1]))
        path = dirs[-1] if len(dirs) > 0 else None
        if path is not None:
            accelerator.load_state(os.path.join(out, path))
            global_step = int(path.split("-")[1])
            got["loaded_from"], got["start_step"] = path, global_step
    else:
        torch.manual_seed(1)  # the global RNG from here on (a resumed run's comes from random_states_0.pkl)
    os.makedirs(out, exist_ok=True)
    while global_step < steps:
        g = torch.Generator().manual_seed(1000 + global_step)
        images = torch.randn(BATCH, 1, 8, 8, generator=g)
        noise = torch.randn_like(images)  # the global RNG: restored from random_states_0.pkl
        timesteps = torch.randint(0, 1000, (BATCH,))
        pred = unet(images + noise, timesteps).sample
        loss = torch.nn.functional.mse_loss(pred, noise)
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        global_step += 1
        got["losses"][str(global_step)] = float(loss)
        if global_step % every == 0:
            if limit is not None:  # _before_ saving state, the checkpoints_total_limit rotation
                checkpoints = os.listdir(out)
                checkpoints = [d for d in checkpoints if d.startswith("checkpoint")]
                checkpoints = sorted(checkpoints, key=lambda x: int(x.split("-")[1]))
                if len(checkpoints) >= limit:
                    num_to_remove = len(checkpoints) - limit + 1
                    for removing in checkpoints[0:num_to_remove]:
                        shutil.rmtree(os.path.join(out, removing))
            accelerator.save_state(os.path.join(out, f"checkpoint-{global_step}"))
    return got


def litgpt_run(out: str, steps: int, every: int, resume: bool) -> dict:
    """litgpt's pretraining save and resume (litgpt 0.5.13, installed without its dependencies:
    only what runs here is imported): a tiny litgpt GPT built from a Config in code, trained with
    Fabric; the save is litgpt.pretrain.save_checkpoint's lines (fabric.save of the state to
    `out_dir / f"step-{step_count:08d}" / "lit_model.pth"`, then the hyperparameters and
    litgpt.utils.save_config's model_config.yaml); the resume litgpt.utils.find_resume_path("auto")
    (max of out_dir.rglob("step-*/*.pth")) and fabric.load(resume, state), as pretrain.main."""
    from pathlib import Path

    import lightning as L
    import yaml
    from litgpt.config import Config
    from litgpt.model import GPT
    from litgpt.utils import find_resume_path, save_config

    fabric = L.Fabric(accelerator="cpu", devices=1)
    config = Config(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=64, padded_vocab_size=64)
    torch.manual_seed(0)
    model = fabric.setup(GPT(config))
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-2))
    state = {"model": model, "optimizer": optimizer, "iter_num": 0, "step_count": 0}
    got: dict = {"losses": {}, "start_step": 0, "loaded_from": None}
    out_dir = Path(out)
    if resume:
        path = find_resume_path("auto", out_dir)
        if path is not None:
            fabric.load(path, state)
            got["loaded_from"], got["start_step"] = str(path.relative_to(out_dir)), state["step_count"]
    while state["step_count"] < steps:
        ids = torch.randint(0, 64, (BATCH, 12), generator=torch.Generator().manual_seed(1000 + state["step_count"]))
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), ids[:, 1:].reshape(-1))
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        state["iter_num"] += 1
        state["step_count"] += 1
        got["losses"][str(state["step_count"])] = float(loss)
        if state["step_count"] % every == 0:  # pretrain.fit -> save_checkpoint
            checkpoint_file = out_dir / f"step-{state['step_count']:08d}" / "lit_model.pth"
            checkpoint_file.parent.mkdir(parents=True, exist_ok=True)
            fabric.save(checkpoint_file, state)
            (checkpoint_file.parent / "hyperparameters.yaml").write_text(yaml.dump({"max_steps": steps}))
            save_config(config, checkpoint_file.parent)
    return got


def fabric_run(out: str, steps: int, every: int, resume: bool) -> dict:
    """Lightning Fabric's build_your_own_trainer example's save and resume lines
    (examples/fabric/build_your_own_trainer/trainer.py, MyCustomTrainer.save / load /
    get_latest_checkpoint, lightning 2.6): state {"model", "optim", "scheduler"} plus global_step and
    current_epoch, `fabric.save(os.path.join(checkpoint_dir, f"epoch-{current_epoch:04d}.ckpt"), state)`;
    the resume: `sorted(os.listdir(checkpoint_dir))[-1]`, `remainder = fabric.load(path, state)`.
    One batch per epoch; a save every EVERY epochs (the example saves after each)."""
    import lightning as L

    fabric = L.Fabric(accelerator="cpu", devices=1)
    torch.manual_seed(0)
    net = mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    model, optim = fabric.setup(net, opt)
    state = {"model": model, "optim": optim, "scheduler": sched}
    got: dict = {"losses": {}, "start_step": 0, "loaded_from": None}
    current_epoch = global_step = 0
    if resume and os.path.isdir(out):
        items = sorted(os.listdir(out))
        if items:
            path = os.path.join(out, items[-1])
            remainder = fabric.load(path, state)
            global_step, current_epoch = remainder.pop("global_step"), remainder.pop("current_epoch")
            got["loaded_from"], got["start_step"] = items[-1], global_step
    os.makedirs(out, exist_ok=True)
    while current_epoch < steps:
        x, y = batch(global_step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optim.zero_grad()
        fabric.backward(loss)
        optim.step()
        sched.step()
        global_step += 1
        current_epoch += 1
        got["losses"][str(global_step)] = float(loss)
        if current_epoch % every == 0:
            state.update(global_step=global_step, current_epoch=current_epoch)
            fabric.save(os.path.join(out, f"epoch-{current_epoch:04d}.ckpt"), state)
    return got


def orbax_run(out: str, steps: int, every: int, resume: bool) -> dict:
    """Orbax's CheckpointManager (orbax-checkpoint 0.12, JAX on CPU): a linear model trained by
    SGD, `manager.save(step, args=StandardSave(state))` every EVERY steps; the resume:
    `manager.latest_step()` and `manager.restore(step, args=StandardRestore(state))`. One weight
    vector large enough that its values are written to a data file of their own."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    n = 65536
    state = {"w": jnp.zeros((n,), jnp.float32), "b": jnp.zeros((), jnp.float32)}
    manager = ocp.CheckpointManager(os.path.abspath(out), options=ocp.CheckpointManagerOptions(max_to_keep=None))
    got: dict = {"losses": {}, "start_step": 0, "loaded_from": None}
    start = 0
    if resume:
        latest = manager.latest_step()
        if latest is not None:
            state = manager.restore(latest, args=ocp.args.StandardRestore(state))
            start = latest
            got["loaded_from"], got["start_step"] = str(latest), latest

    def loss_fn(s, x, y):
        return jnp.mean((x @ s["w"] + s["b"] - y) ** 2)

    grad = jax.jit(jax.value_and_grad(loss_fn))
    for step in range(start, steps):
        rng = np.random.default_rng(1000 + step)
        x = jnp.asarray(rng.standard_normal((BATCH, n), dtype=np.float32))
        y = jnp.asarray(rng.standard_normal((BATCH,), dtype=np.float32))
        loss, g = grad(state, x, y)
        state = jax.tree_util.tree_map(lambda p, d: p - 1e-3 * d, state, g)
        got["losses"][str(step + 1)] = float(loss)
        if (step + 1) % every == 0:
            manager.save(step + 1, args=ocp.args.StandardSave(state))
    manager.wait_until_finished()
    manager.close()
    return got


RUNS = {"dcp": dcp_run, "hf-trainer": hf, "lightning": lightning, "deepspeed": deepspeed_run,
        "accelerate": accelerate_run, "diffusers": diffusers_run, "litgpt": litgpt_run, "fabric": fabric_run,
        "orbax": orbax_run}

if __name__ == "__main__":
    layout, out, n, every, result = sys.argv[1:6]
    got = RUNS[layout](out, int(n), int(every), len(sys.argv) > 6 and sys.argv[6] == "resume")
    with open(result, "w") as fh:
        json.dump(got, fh)
