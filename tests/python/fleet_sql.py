#!/usr/bin/env python3
"""Runs the SQL of `memleak sql` on DuckDB or Spark and prints its rows as
JSON, one object per row with every value a string or an integer (Spark's
DECIMAL(20,0) becomes an integer), for the tests that compare it with
`memleak analyze`.

    fleet_sql.py duckdb|spark FILE.sql > rows.json

Spark runs in local mode (`local[2]`); `SPARK_PYTHON` names the python
with pyspark when it is not this one.
"""

import decimal
import json
import shutil
import sys
import tempfile
import time


def plain(v):
    if isinstance(v, decimal.Decimal):
        return int(v)
    return v


def duckdb_rows(sql):
    import duckdb

    con = duckdb.connect()
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, map(plain, r))) for r in cur.fetchall()]


def spark_rows(sql):
    from pyspark.sql import SparkSession

    # Spark makes its warehouse directory where it runs, which is the
    # checkout under `cargo test`: give it a temporary one instead.
    warehouse = tempfile.mkdtemp(prefix="memleak-spark-")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("memleak-sql")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.warehouse.dir", warehouse)
        .config("spark.sql.shuffle.partitions", "4")
        # Its vectorized reader cannot read DELTA_BINARY_PACKED unsigned
        # 64-bit columns (ts_ns, seq): docs/fleet.md.
        .config("spark.sql.parquet.enableVectorizedReader", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        t0 = time.monotonic()
        # Spark runs one statement at a time: drop the trailing ';'.
        df = spark.sql(sql.strip().rstrip(";"))
        rows = [{k: plain(v) for k, v in r.asDict().items()} for r in df.collect()]
        print(f"spark query: {time.monotonic() - t0:.2f} s", file=sys.stderr)
        return rows
    finally:
        spark.stop()
        shutil.rmtree(warehouse, ignore_errors=True)


def main():
    engine, path = sys.argv[1], sys.argv[2]
    sql = open(path).read()
    t0 = time.monotonic()
    rows = duckdb_rows(sql) if engine == "duckdb" else spark_rows(sql)
    print(f"{engine}: {len(rows)} rows in {time.monotonic() - t0:.2f} s", file=sys.stderr)
    json.dump(rows, sys.stdout)


if __name__ == "__main__":
    main()
