"""One compile run: its plan and report models, its order of work, the way it runs (with
or without Prefect, on work pools) and the runs kept to be recorded later."""
