"""``python -m zeroedu`` runs the command line (`zeroedu.cli`)."""
from zeroedu.cli import main

raise SystemExit(main())
