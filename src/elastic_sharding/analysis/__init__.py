"""The analysis of a `--analyze` job: every number and figure `dj-analyze` makes, exact, from the
statistics the workers computed shard by shard, without gathering the rows on one node.

  columns   per shard (`columns.py`): each statistic's values sorted and written as a column
            file, with the shard's counts, value counts and exact integer sums (`exact.py`) for
            the means, standard deviations and correlations, which merge by addition, so every
            number is the same whatever the cut into shards;
  plan      once: which statistics are analysed and how, decided as pandas would decide on the
            whole column (`overall.plan_columns`);
  stats     per statistic: `describe`'s row with exact percentiles (a rank selection over the
            shards' sorted columns, `select.py`), the histogram's and box plot's numbers, its
            figures (`figures.py`);
  report    once: `overall.csv`/`overall.md`, the correlation heatmap from the merged sums
            (`correlation.py`), `all-stats.png` when asked, and `index.html` (`html_index.py`).

Work and memory of every unit but `columns` grow with shards × statistics, never with rows.
`cooperate.py` shares the units among any number of processes through `claims/units.py`.
"""
