-- Run by the smoke test through WithInitScripts on the container's first start.
CREATE TABLE tenantdbtest_init (id int PRIMARY KEY, note text NOT NULL);
INSERT INTO tenantdbtest_init VALUES (1, 'created by testdata/init.sql');
