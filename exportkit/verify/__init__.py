"""exportkit verify, in the order the data flows (command.py strings the steps together):

    plan.py      what will run: the signatures and their batches (inputs/loader.py), the runtimes, the pairs
    execute.py   every runtime built (runtimes/factory.py) and started, each lane's batches through
                 runtimes/loop.py, all closed; infrastructure failures
    pairs.py     the plan's pairs over the outputs, through the pure comparisons of compare/
    checks.py    static checks, served signatures, behaviours (behaviours.py), baseline (baseline.py), the chain
    report.py    the report; render_text, render_junit, render_html, render_markdown its renderings; output.py
                 writes them where the flags say
    dataset.py   verify --data: the same plan and runtimes, streamed over records (data/)

A new runtime goes into exportkit/runtimes/ (factory.py builds it) and plan.plan_runtimes; a new comparison of two
arrays into compare/outputs.py; a new check into checks.py.
"""
