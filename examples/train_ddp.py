"""Data-parallel training (``torch.distributed`` over gloo, on the CPU) from Sluice rings, with
``data.even_batches``: every rank gets the same number of batches in each epoch, so the ranks step
in lockstep to the epoch's end, and the pad rows (``_sluice_pad``) are masked out of the loss. With
``pad`` a ring with fewer batches pads; with ``drop`` the batches past the fewest are dropped, and
``_sluice_pad`` is true only after a daemon was killed mid-epoch.

Run it as the trainer of ``examples/even_batches.yaml`` or ``examples/even_batches_drop.yaml`` (from
the repository's root)::

    sluice gen --out /tmp/sluice-train --rows 200000 --files 4
    SLUICE_EXAMPLE_DATA=/tmp/sluice-train sluice run examples/even_batches.yaml

Each rank prints, per epoch, its steps and how many of its rows were pads.
"""

import json
import os

import torch
import torch.distributed as dist

from sluice.torch import Dataset

FEATURES = [f"feature_{index}" for index in range(4)]


def main():
    rank, world_size = int(os.environ["SLUICE_RANK"]), int(os.environ["SLUICE_WORLD_SIZE"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(len(FEATURES), 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_function = torch.nn.BCEWithLogitsLoss(reduction="none")
    dataset = Dataset()
    for epoch in range(int(os.environ.get("SLUICE_EXAMPLE_EPOCHS", "2"))):
        steps = pad_rows = 0
        for item in torch.utils.data.DataLoader(dataset, batch_size=None):
            # The generated features have a few nulls, which come as NaN.
            features = torch.nan_to_num(torch.stack([item[name] for name in FEATURES], dim=1))
            labels = item["label"].to(torch.float32).unsqueeze(1)
            keep = (~item["_sluice_pad"]).to(torch.float32).unsqueeze(1)
            losses = loss_function(model(features), labels)
            # A batch of pads alone still steps, with no gradient of its own, so that DDP's
            # all-reduce meets every rank.
            loss = (losses * keep).sum() / keep.sum().clamp(min=1.0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            pad_rows += int(item["_sluice_pad"].sum())
        print(json.dumps({"rank": rank, "epoch": epoch, "steps": steps, "pad_rows": pad_rows}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
