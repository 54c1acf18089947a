"""Cost control, the pure part: prices, the calendar of budget periods, budget arithmetic.

Nothing here does I/O or reads a clock of its own: the ledger, admission and the admin
API (in `app.limits`, `app.db`, `app.api`) bring the data and the time.
"""
