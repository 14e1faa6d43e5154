"""Local servers the pipeline starts and stops: PostgreSQL and an MLflow tracking server (servers/local.py). Not
Prefect tasks (tasks/) nor flows (flows/): the command line, the flows and the tests start them alike."""
