"""The GitHub Actions workflows as validated records: ``model`` (records -> YAML), ``definitions`` (the
workflows). ``python -m dspark_ci.ci.workflows`` writes .github/workflows/."""
