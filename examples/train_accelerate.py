"""A small model trained with Hugging Face Accelerate on the CPU from a Sluice ring, checkpointed with
``accelerator.save_state`` and resumed with ``accelerator.load_state``.

The loader is ``sluice.torch.Dataset`` in a ``DataLoader`` that ``accelerator.prepare`` turns into
Accelerate's stateful loader (``DataLoaderConfiguration(use_stateful_dataloader=True)``: torchdata's
``StatefulDataLoader``), so ``save_state`` saves the data position with the model and the
optimizer. That loader asks for the dataset's state at every step, which costs a snapshot of the
position and no call to the AM; the data checkpoint is committed when ``save_state`` writes it.
It also fetches one batch ahead of the one the loop trains on, hence ``Dataset(keep_batches=2)``:
the batch in use stays in the ring until the loop moves on.

Run it as the trainer of a job, for example with ``examples/torch.yaml`` and the role's command
``[python3, examples/train_accelerate.py, --checkpoint-dir, /tmp/sluice-accelerate]``. Every
``--save-every`` steps it saves its state to the checkpoint directory; started again, it finds the
state there and trains on exactly the rows it had not trained on at that step, in this job (the AM
rolls the job back to the checkpoint) or in one started again with ``--resume-from TOKEN``.

``dispatch_batches=False``: Accelerate would otherwise read an ``IterableDataset`` in the main
process alone and send its batches to the others, where each Sluice rank reads its own ring. This
example runs one process: with several, ``prepare`` wraps an ``IterableDataset`` in
``IterableDatasetShard``, which keeps every n-th item of each rank's ring. Several processes keep
the loader out of ``prepare`` instead, and save its state with ``register_for_checkpointing`` through
an object whose ``state_dict()`` returns ``sluice.torch.commit(loader.state_dict())``: Accelerate
writes those objects from the main process only, so every rank commits when asked.
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator, DataLoaderConfiguration

from sluice.torch import Dataset

FEATURES = [f"feature_{index}" for index in range(4)]


class Progress:
    """The step and the epoch, saved and loaded with the rest of the state."""

    def __init__(self) -> None:
        self.step = 0
        self.epoch = 0

    def state_dict(self):
        return {"step": self.step, "epoch": self.epoch}

    def load_state_dict(self, state) -> None:
        self.step = state["step"]
        self.epoch = state["epoch"]


def features_of(item):
    # The generated features have a few nulls, which come as NaN.
    return torch.nan_to_num(torch.stack([item[name] for name in FEATURES], dim=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint-dir", required=True, help="where the state is saved, and found again")
    parser.add_argument("--save-every", type=int, default=20, help="steps between two saves")
    parser.add_argument("--epochs", type=int, default=1, help="the job's data.epochs")
    parser.add_argument("--max-steps", type=int, help="stop after this step, as a crash would")
    parser.add_argument("--ids-out", help="a file to append each step's ids to, as JSON lines")
    args = parser.parse_args()

    accelerator = Accelerator(
        cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True, dispatch_batches=False)
    )
    model = torch.nn.Sequential(torch.nn.Linear(len(FEATURES), 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(Dataset(keep_batches=2), batch_size=None)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if os.path.exists(os.path.join(args.checkpoint_dir, "dl_state_dict.bin")):
        accelerator.load_state(args.checkpoint_dir)
        print(json.dumps({"resumed_at_step": progress.step}), flush=True)

    loss_function = torch.nn.BCEWithLogitsLoss()
    ids_out = open(args.ids_out, "a") if args.ids_out else None
    for epoch in range(progress.epoch, args.epochs):
        progress.epoch = epoch
        for item in loader:
            labels = item["label"].to(torch.float32).unsqueeze(1)
            loss = loss_function(model(features_of(item)), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            progress.step += 1
            if ids_out:
                ids_out.write(json.dumps({"step": progress.step, "epoch": epoch, "ids": item["id"].tolist()}) + "\n")
                ids_out.flush()
            if progress.step % args.save_every == 0:
                accelerator.save_state(args.checkpoint_dir)
                print(json.dumps({"checkpoint_step": progress.step, "loss": float(loss)}), flush=True)
            if progress.step == args.max_steps:
                return
    print(json.dumps({"steps": progress.step}), flush=True)


if __name__ == "__main__":
    main()
