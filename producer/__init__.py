"""The producer side: `python -m producer` (enqueue, status, dead, export, demo).

Parts, one idea each:
- `prompts`: reading the three input forms, line by line, with clear errors.
- `enqueue`: publishing a file as tasks; resuming a run.
- `dead`: replaying dead letters.
- `export`: the dataset, each id once, with a manifest; `formats`: the same rows as each trainer reads them.
- `report` / `show`: the run report and a sample or dead letter decoded.
- `status`: where a run stands.
- `local` / `demo`: the whole fleet on one machine.
"""
