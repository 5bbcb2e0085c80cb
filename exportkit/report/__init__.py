"""What every command's report shares: the Report base (passed, exit_code, verdict, to_dict), formatting
helpers, HTML, Markdown and JUnit building blocks, plots and the files the flags ask for. Imports no command."""
