"""What a user runs to produce numbers and tables: bench, campaign, report, export, overhead."""
