"""What the notebooks draw and check, built only from reports and `zeroedu.theory`.

* `viz`: matplotlib figures (closed forms, one run's report, sharding layouts);
* `widgets`: ipywidgets dashboards, one module per dashboard;
* `nbtools`: show the package's own code, diff two strategies, check an exercise, assert that a
  run's measurement equals its prediction;
* `report`: reports and closed forms as text tables (also used by the CLI).

No algorithm lives here: a notebook cell and these helpers only read what the package computes.
"""
