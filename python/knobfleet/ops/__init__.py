"""Operations (use cases): plan, apply, transactions, rollback, history, drift/verify."""
