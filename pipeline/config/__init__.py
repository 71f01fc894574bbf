"""The typed `params.yaml`: one module per section, so a stage imports (and dvc.yaml ties it to) only the
sections it reads. Each stage declares its `StageParams` subclass with those sections; `schema.Params`
holds every section for `draftline params check`.

Every section forbids unknown keys, so a typo fails loudly instead of silently using a default. The
defaults are the recommended values; `params.yaml` states only what the demo deliberately changes.
"""
