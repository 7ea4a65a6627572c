-- CPU-bound work for the adaptive-limit tests and bench/noisy: 300,000 rows
-- that a noisy tenant scans computing md5 over every row (no index helps, the
-- time is all CPU), and that a quiet tenant reads one at a time by primary key.
create table cpu_rows (
    id      integer primary key,
    payload text not null
);
insert into cpu_rows select g, md5(g::text) from generate_series(1, 300000) g;
vacuum analyze cpu_rows;
