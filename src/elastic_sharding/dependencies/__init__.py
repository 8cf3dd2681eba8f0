"""The Python packages a recipe's operators import: found and checked before a job starts
(`operators`, `resolve`), recorded in the manifest, checked again by every worker, installed only
when the user asks (`install`), and never installed behind a running job's back (`guard`)."""
