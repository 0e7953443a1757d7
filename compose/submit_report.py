"""Entry file for ``spark-submit`` (which wants a .py file): runs ``cmq-audit`` with its args.

    spark-submit --master spark://spark-master:7077 /app/compose/submit_report.py \\
        report --audit-dir /audit --out /reports
"""

import sys

from spark.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
