package tenantdb

import "time"

// DatabasesStat is the budget of a Pool with Config.Database: the server
// connections of all its databases together.
type DatabasesStat struct {
	// Budget is the pgxpool.Config's MaxConns; Open counts the connections
	// open or opening now, never more than Budget.
	Budget, Open int
	// Databases counts the databases with a pgxpool now (at most
	// Config.MaxDatabases), besides the template's own.
	Databases int
	// Opens and Closes count the connections opened and closed since New:
	// their growth beside the calls made is the churn of moving
	// connections between databases.
	Opens, Closes int64
	// ConnectTime is the total time of those opens, from asking the budget
	// for room (closing another database's idle connection when it is
	// spent) to the connection being ready.
	ConnectTime time.Duration
}

// DatabaseStat is one database's connections.
type DatabaseStat struct {
	Database string
	// Server is the database's server with NewServers, else "".
	Server string
	// Open counts its connections open or opening; Idle and InUse are its
	// pgxpool's idle and acquired ones.
	Open, Idle, InUse int
	// Opens, Closes and ConnectTime are as in DatabasesStat, for this
	// database since its pgxpool was created.
	Opens, Closes int64
	ConnectTime   time.Duration
}

func (db *database) stat() DatabaseStat {
	s := db.pg.Stat()
	return DatabaseStat{
		Database: db.name, Server: db.d.server,
		Open: int(db.open.Load()), Idle: int(s.IdleConns()), InUse: int(s.AcquiredConns()),
		Opens: db.opens.Load(), Closes: db.closes.Load(), ConnectTime: time.Duration(db.connecting.Load()),
	}
}

// DatabasesStat returns the budget's totals; the zero value without
// Config.Database. With NewServers, the sums over the servers
// (ServersStat has each).
func (p *Pool) DatabasesStat() DatabasesStat {
	if p.servers != nil {
		var s DatabasesStat
		for _, d := range p.servers {
			ds := d.stat()
			s.Budget += ds.Budget
			s.Open += ds.Open
			s.Databases += ds.Databases
			s.Opens += ds.Opens
			s.Closes += ds.Closes
			s.ConnectTime += ds.ConnectTime
		}
		return s
	}
	if p.dbs == nil {
		return DatabasesStat{}
	}
	return p.dbs.stat()
}

func (d *databases) stat() DatabasesStat {
	s := DatabasesStat{Budget: d.budget.max, Open: d.budget.opened()}
	d.mu.Lock()
	s.Databases = len(d.byName)
	d.mu.Unlock()
	s.Opens, s.Closes, s.ConnectTime = d.totals.opens.Load(), d.totals.closes.Load(), time.Duration(d.totals.connecting.Load())
	return s
}

// AppendDatabaseStat appends a snapshot of every database with a pgxpool
// now, most recently used first, the template's own last, to dst. It
// visits every database: call it for reports and metrics, not per request.
// Without Config.Database it returns dst. With NewServers, every server's,
// by server name.
func (p *Pool) AppendDatabaseStat(dst []DatabaseStat) []DatabaseStat {
	for _, name := range p.Servers() {
		d := p.servers[name]
		d.each(func(db *database) { dst = append(dst, db.stat()) })
		dst = append(dst, d.admin.stat())
	}
	if p.dbs == nil {
		return dst
	}
	p.dbs.each(func(db *database) { dst = append(dst, db.stat()) })
	return append(dst, p.dbs.admin.stat())
}
