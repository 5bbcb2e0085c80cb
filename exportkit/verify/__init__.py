"""exportkit verify, in the order the data flows (command.py strings the steps together):

    plan.py      what will run: the signatures and their batches (inputs.py), the runtimes, the pairs compared
    execute.py   start every runtime, run every batch through it, close them all; infrastructure failures
    pairs.py     the plan's pairs over the outputs, through the pure comparisons of compare.py
    checks.py    static checks, served signatures, behaviours (behaviours.py), baseline (baseline.py), the chain
    report.py    the report and its renderings; output.py writes them where the flags say
    dataset.py   verify --data: the same plan and execution pieces, streamed over records
    matrix.py    exportkit compat (and its --run, with the same pieces)

A new runtime goes into exportkit/runtimes/ and plan.plan_runtimes / execute._build; a new comparison of two
arrays into compare.py; a new check into checks.py.
"""
