"""A small MLP trained on the CPU from a Sluice ring, through ``sluice.torch.Dataset``.

Run it as the trainer of ``examples/torch.yaml`` (from the repository's root)::

    sluice gen --out /tmp/sluice-train --rows 200000 --files 4
    export SLUICE_EXAMPLE_DATA=/tmp/sluice-train SLUICE_EXAMPLE_STATE=/tmp/sluice-train-state
    sluice run examples/torch.yaml

Every ``CHECKPOINT_EVERY`` steps it saves the model, the optimizer and the data position together
to ``$SLUICE_EXAMPLE_STATE/model.pt`` (``Dataset.state_dict()`` notes the position, and ``torch.save``
commits it to the AM as a data checkpoint as it pickles it). To resume after a crash, start the job
again from the token the checkpoint holds (printed at each save)::

    sluice run examples/torch.yaml --resume-from TOKEN

and the trainer, finding the file, loads the model and the data position: it sees exactly the rows
it had not trained on at that step.
"""

import json
import os

import torch

from sluice.torch import Dataset

FEATURES = [f"feature_{index}" for index in range(4)]
CHECKPOINT_EVERY = 20


def features_of(item):
    # The generated features have a few nulls, which come as NaN.
    return torch.nan_to_num(torch.stack([item[name] for name in FEATURES], dim=1))


def main():
    state = os.environ.get("SLUICE_EXAMPLE_STATE")
    checkpoint_path = os.path.join(state, "model.pt") if state else None
    dataset = Dataset()
    model = torch.nn.Sequential(torch.nn.Linear(len(FEATURES), 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    if checkpoint_path and os.path.exists(checkpoint_path):
        saved = torch.load(checkpoint_path)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        dataset.load_state_dict(saved["data"])
        step = saved["data"]["step"]
        print(json.dumps({"resumed_at_step": step}), flush=True)
    loss_function = torch.nn.BCEWithLogitsLoss()
    rows = 0
    loss = None
    for item in torch.utils.data.DataLoader(dataset, batch_size=None):
        labels = item["label"].to(torch.float32).unsqueeze(1)
        loss = loss_function(model(features_of(item)), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        rows += len(labels)
        if checkpoint_path and step % CHECKPOINT_EVERY == 0:
            data = dataset.state_dict()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "data": data}, checkpoint_path)
            print(json.dumps({"checkpoint_step": step, "rows": rows, "token": data["token"].token}), flush=True)
    print(json.dumps({"steps": step, "rows": rows, "loss": None if loss is None else float(loss)}), flush=True)


if __name__ == "__main__":
    main()
