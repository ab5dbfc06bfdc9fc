"""What happened to the requests, for operators and users: the hourly summaries the pages read
(`summaries.py`), the statistics of finished requests (`statistics.py`), purging finished
requests once counted (`purge.py`), and the status queries of users and CRAB-style clients
(`queries.py`)."""
