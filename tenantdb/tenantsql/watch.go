package tenantsql

import (
	"context"
	"database/sql/driver"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/tenantdb/tenantdb/tenantdb"
)

// Time limits. Under its tenant's IdleInTransactionTimeout or MaxHold, a
// connection's slot has a watch (tenantdb.SlotWatch, cn.w): every driver
// call that touches the connection, the transaction's Commit and Rollback,
// a statement's calls, and rows until they are closed count as a call in
// progress, and the watch ends the hold only between calls. Once it did,
// every call fails with tenantdb.ErrIdleInTransaction or
// tenantdb.ErrMaxHold (and sql.ErrConnDone), never driver.ErrBadConn: a
// statement of an ended transaction is not retried elsewhere.

// watchedTx is a transaction whose Commit and Rollback are calls under the
// watch: after the watch rolled it back, both fail with its error.
type watchedTx struct {
	tx driver.Tx
	cn *conn
}

func (t *watchedTx) Commit() error {
	if err := t.cn.w.Enter(); err != nil {
		return err
	}
	defer t.cn.w.Leave()
	return t.tx.Commit()
}

func (t *watchedTx) Rollback() error {
	if err := t.cn.w.Enter(); err != nil {
		return err
	}
	defer t.cn.w.Leave()
	return t.tx.Rollback()
}

// watchedStmt is a statement prepared on the server whose calls are under
// the watch. Embedding *stdlib.Stmt keeps NumInput and its checks.
type watchedStmt struct {
	*stdlib.Stmt
	cn *conn
}

var (
	_ driver.StmtExecContext  = (*watchedStmt)(nil)
	_ driver.StmtQueryContext = (*watchedStmt)(nil)
)

// Close deallocates the statement, unless the watch gave the connection
// back: then it is another holder's, and pgxpool's reset forgets it.
func (s *watchedStmt) Close() error {
	if s.cn.w.Enter() != nil {
		return nil
	}
	defer s.cn.w.Leave()
	return s.Stmt.Close()
}

func (s *watchedStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := s.cn.w.Enter(); err != nil {
		return nil, err
	}
	defer s.cn.w.Leave()
	return s.Stmt.ExecContext(ctx, args)
}

func (s *watchedStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.cn.w.Enter(); err != nil {
		return nil, err
	}
	rows, err := s.Stmt.QueryContext(ctx, args)
	if err != nil {
		s.cn.w.Leave()
		return nil, err
	}
	return s.cn.watchRows(rows), nil
}

func (s *watchedStmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), named(args))
}

func (s *watchedStmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), named(args))
}

// watchRows makes rows, returned by a call that entered cn's watch, a call
// in progress until they are closed.
func (cn *conn) watchRows(rows driver.Rows) driver.Rows {
	if cn.w == nil {
		return rows
	}
	switch r := rows.(type) {
	case *localRows:
		r.w = cn.w
		return r
	case *stdlib.Rows:
		return &watchedRows{Rows: r, w: cn.w}
	}
	// Rows of a kind it cannot see closing: the watch can tell nothing.
	cn.w.Disarm()
	cn.w.Leave()
	return rows
}

// watchedRows are rows under the watch, a call in progress until closed.
// Embedding *stdlib.Rows keeps its optional interfaces.
type watchedRows struct {
	*stdlib.Rows
	w    *tenantdb.SlotWatch
	done bool
}

func (r *watchedRows) Close() error {
	err := r.Rows.Close()
	if !r.done {
		r.done = true
		r.w.Leave()
	}
	return err
}
