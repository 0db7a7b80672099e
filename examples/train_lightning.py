"""A small model trained with PyTorch Lightning on the CPU from a Sluice ring, through a
``LightningDataModule`` whose state is the data checkpoint, saved in Lightning's checkpoints.

Lightning asks every rank for the data module's ``state_dict()`` when it saves a checkpoint, but
writes rank 0's file alone: the other ranks pickle nothing. So the data module commits the data
checkpoint when it is asked (``sluice.torch.commit``), on every rank, and hands Lightning the
committed state. Lightning's loop also fetches one batch ahead of the one it trains on: the data
module counts the batches handed to ``training_step`` and asks for the state of that step (the
dataset keeps the last few), and ``Dataset(keep_batches=2)`` keeps the batch in use in the ring.

Run it as the trainer of a job, for example with ``examples/torch.yaml`` and the role's command
``[python3, examples/train_lightning.py, --checkpoint-dir, /tmp/sluice-lightning]``. Every
``--save-every`` steps Lightning saves a checkpoint there (``step=N.ckpt``); started again, the
script resumes from the latest one and trains on exactly the rows it had not trained on at that
step, in this job (the AM rolls the job back to the checkpoint) or in one started again with
``--resume-from TOKEN``.
"""

import argparse
import json
import pathlib
import re

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from sluice.torch import Dataset, commit

FEATURES = [f"feature_{index}" for index in range(4)]


class SluiceData(L.LightningDataModule):
    """The rank's ring as the training data; the data checkpoint is the module's state."""

    def __init__(self, ids_out=None):
        super().__init__()
        self.dataset = Dataset(keep_batches=2)
        # The batches handed to training_step, counted as the dataset counts its steps.
        self.step = 0
        self.ids_out = open(ids_out, "a") if ids_out else None

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.dataset, batch_size=None)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        if self.trainer.training:
            self.step += 1
            if self.ids_out:
                line = {"step": self.step, "epoch": self.trainer.current_epoch, "ids": batch["id"].tolist()}
                self.ids_out.write(json.dumps(line) + "\n")
                self.ids_out.flush()
        return batch

    def state_dict(self):
        state = commit(self.dataset.state_dict(step=self.step))
        print(json.dumps({"checkpoint_step": self.step, "token": state["token"]}), flush=True)
        return state

    def load_state_dict(self, state):
        self.dataset.load_state_dict(state)
        self.step = state["step"]
        print(json.dumps({"resumed_at_step": self.step}), flush=True)


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(len(FEATURES), 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        self.loss_function = torch.nn.BCEWithLogitsLoss()

    def training_step(self, item, batch_idx):
        # The generated features have a few nulls, which come as NaN.
        features = torch.nan_to_num(torch.stack([item[name] for name in FEATURES], dim=1))
        return self.loss_function(self.net(features), item["label"].to(torch.float32).unsqueeze(1))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def latest_checkpoint(directory: pathlib.Path):
    steps = {int(match.group(1)): path for path in directory.glob("step=*.ckpt") if (match := re.fullmatch(r"step=(\d+)\.ckpt", path.name))}
    return steps[max(steps)] if steps else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dir", required=True, help="where Lightning saves its checkpoints, and finds them again")
    parser.add_argument("--save-every", type=int, default=20, help="steps between two checkpoints")
    parser.add_argument("--epochs", type=int, default=1, help="the job's data.epochs")
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this step, as a crash would")
    parser.add_argument("--ids-out", help="a file to append each step's ids to, as JSON lines")
    args = parser.parse_args()

    checkpoints = ModelCheckpoint(dirpath=args.checkpoint_dir, filename="{step}", every_n_train_steps=args.save_every, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    resume_from = latest_checkpoint(pathlib.Path(args.checkpoint_dir))
    trainer.fit(Model(), datamodule=SluiceData(args.ids_out), ckpt_path=resume_from)
    print(json.dumps({"steps": trainer.global_step}), flush=True)


if __name__ == "__main__":
    main()
