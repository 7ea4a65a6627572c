package tenantsql

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// commitTimeout bounds the COMMIT sent when a query's rows are closed, which
// database/sql does without a context.
const commitTimeout = 5 * time.Second

// idle reports whether the connection is outside a transaction.
func (cn *conn) idle() bool { return cn.pg.Conn().PgConn().TxStatus() == 'I' }

// execLocal runs query after the tenant's setting in one implicit
// transaction. Without arguments it keeps pgx's simple protocol, as
// stdlib's ExecContext does, so that query may hold several statements.
func (cn *conn) execLocal(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c := cn.pg.Conn()
	var tag pgconn.CommandTag
	var err error
	if len(args) == 0 {
		tag, err = c.Exec(ctx, tenantdb.WithLocalSettings(query, cn.local))
	} else {
		b := &pgx.Batch{}
		b.Queue(cn.local)
		b.Queue(query, values(args)...)
		br := c.SendBatch(ctx, b)
		if _, err = br.Exec(); err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		if pgconn.SafeToRetry(err) {
			return nil, driver.ErrBadConn // nothing was sent: database/sql may retry on a new connection
		}
		return nil, inTransactionBlock(err)
	}
	return driver.RowsAffected(tag.RowsAffected()), nil
}

// queryLocal opens a transaction with the tenant's setting and runs query
// in it; the rows commit it when closed.
func (cn *conn) queryLocal(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if tenantdb.BeginsTransaction(query) {
		// It would run inside the transaction that carries the values,
		// which its rows' Close commits: its isolation level lost, the
		// transaction ended before the statements meant for it.
		return nil, fmt.Errorf("%w: %q", ErrBeginWithQuery, query)
	}
	c := cn.pg.Conn()
	if _, err := c.Exec(ctx, "begin;\n"+cn.local); err != nil {
		if pgconn.SafeToRetry(err) {
			return nil, driver.ErrBadConn
		}
		cn.endLocal("rollback")
		return nil, err
	}
	rows, err := cn.pg.QueryContext(ctx, query, args)
	if err != nil {
		cn.endLocal("rollback")
		return nil, inTransactionBlock(err)
	}
	return &localRows{Rows: rows.(*stdlib.Rows), cn: cn}, nil
}

// endLocal ends queryLocal's transaction with "commit" or "rollback". A
// connection it cannot end goes back to pgxpool in a transaction, which
// destroys it.
func (cn *conn) endLocal(sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	_, err := cn.pg.Conn().Exec(ctx, sql)
	return err
}

// localRows are a query's rows in queryLocal's transaction. Embedding
// *stdlib.Rows keeps its optional interfaces (column types and names).
type localRows struct {
	*stdlib.Rows
	cn   *conn
	w    *tenantdb.SlotWatch // set by watchRows: the rows are a call in progress until closed
	done bool
}

// Close closes the rows and commits their transaction (a failed one rolls
// back).
func (r *localRows) Close() error {
	err := r.Rows.Close()
	if r.done {
		return err
	}
	r.done = true
	if cerr := r.cn.endLocal("commit"); err == nil {
		err = cerr
	}
	r.w.Leave()
	return err
}

// localStmt is a prepared statement that runs through the connection's
// ScopeTransaction paths. Prepared outside a transaction it is not
// prepared on the server (st is nil): PostgreSQL would resolve its names
// in the session's search_path, not the tenant's. database/sql then learns
// its number of arguments only from the server's error.
type localStmt struct {
	st    *stdlib.Stmt // prepared inside a transaction, or nil
	cn    *conn
	query string
}

var (
	_ driver.StmtExecContext  = (*localStmt)(nil)
	_ driver.StmtQueryContext = (*localStmt)(nil)
)

// Close deallocates a statement prepared on the server, unless the
// tenant's time limits gave the connection back (see watchedStmt.Close).
func (s *localStmt) Close() error {
	if s.st == nil || s.cn.w.Enter() != nil {
		return nil
	}
	defer s.cn.w.Leave()
	return s.st.Close()
}

func (s *localStmt) NumInput() int {
	if s.st == nil {
		return -1
	}
	return s.st.NumInput()
}

func (s *localStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.cn.ExecContext(ctx, s.query, args)
}

func (s *localStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.cn.QueryContext(ctx, s.query, args)
}

// Exec and Query are database/sql's calls without a context, which it
// makes only for drivers without the Context forms.
func (s *localStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *localStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

// named numbers args as database/sql does.
func named(args []driver.Value) []driver.NamedValue {
	out := make([]driver.NamedValue, len(args))
	for i, v := range args {
		out[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return out
}

// inTransactionBlock makes err match tenantdb.ErrCannotRunInTransaction
// when PostgreSQL refused a statement (CREATE INDEX CONCURRENTLY, VACUUM)
// because ScopeTransaction put it in a transaction block.
func inTransactionBlock(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25001" {
		return fmt.Errorf("%w: %w", tenantdb.ErrCannotRunInTransaction, err)
	}
	return err
}

// values returns the arguments' values, as stdlib passes them to pgx.
func values(args []driver.NamedValue) []any {
	out := make([]any, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}
