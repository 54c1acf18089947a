"""Cost control: prices, the calendar of budget periods, budgets and their spend, the ledger.

    prices.py, timetable.py      what a request costs (per model, per billing window)
    periods.py, budget_rules.py  calendar periods; budget arithmetic (pure)
    spend.py                     SpendGate: budgets reserved, then settled, per process
    shared_spend.py, budget.lua  ... decided in Redis across replicas (the engine's client)
    books.py                     the budget SQL: live overrides and the durable spend table
    ledger.py                    the usage ledger: every request's tokens and cost, to SQL
    usage_report.py              reports folded from the ledger's rows

Prices, periods and budget arithmetic do no I/O and read no clock of their own.
"""
