"""The producer side: `python -m producer` (enqueue, status, dead, export, demo).

Parts, one idea each:
- `prompts`: reading the three input forms, line by line, with clear errors.
- `chat`: the chat template, token ids and the think-start check.
- `enqueue`: publishing a file as tasks; resuming a run.
- `dead`: replaying dead letters.
- `export`: the dataset, each id once, with a manifest.
- `status`: where a run stands.
- `local` / `demo`: the whole fleet on one machine.
"""
