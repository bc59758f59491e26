package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/ferrymq/ferrymq/gateway/alarm"
)

// Defaults of the alarm command.
const (
	defaultHTTP = "127.0.0.1:18083"
	envHTTP     = "FERRYMQ_HTTP"
	// maxAlarmListBytes bounds the answer read: 1000 events of 64 KiB at
	// most, and then some.
	maxAlarmListBytes = 80 << 20
)

func newAlarmCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "alarm",
		Short: "Show the server's alarms",
		Example: `  ferrymq alarm list
  ferrymq alarm list --recent 20 --json`,
		Args: cobra.NoArgs,
		RunE: helpRunE,
	}
	cmd.AddCommand(newAlarmListCmd())
	return cmd
}

type alarmListOptions struct {
	client clientOptions // token, timeout; --server is not used
	http   string
	recent int
	json   bool
}

func newAlarmListCmd() *cobra.Command {
	o := &alarmListOptions{}
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the active alarms and the latest raised and cleared events (GET /api/v1/alarms)",
		Example: `  ferrymq alarm list
  ferrymq alarm list --http 10.0.0.5:18083 --recent 0
  ferrymq alarm list --json | jq '.active[].kind'`,
		Args: cobra.NoArgs,
		RunE: runE(o.run),
	}
	o.client.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.http, "http", defaultHTTP, "HTTP address of the server, host:port or a URL; also read from "+envHTTP)
	f.IntVar(&o.recent, "recent", 20, "how many of the latest events to show beside the active alarms (0 to 1000)")
	f.BoolVar(&o.json, "json", false, "print the answer as JSON: {active: [...], recent: [...]}")
	return cmd
}

func (o *alarmListOptions) run(cmd *cobra.Command, _ []string) error {
	if err := o.client.resolve(cmd); err != nil {
		return err
	}
	if v := getenv(envHTTP); v != "" && !cmd.Flags().Changed("http") {
		o.http = v
	}
	if o.recent < 0 || o.recent > 1000 {
		return fmt.Errorf("--recent %d: want 0 to 1000", o.recent)
	}
	list, err := o.fetch(cmd)
	if err != nil {
		return err
	}
	if o.json {
		return writeJSON(cmd.OutOrStdout(), list)
	}
	w := cmd.OutOrStdout()
	if len(list.Active) == 0 {
		fmt.Fprintln(w, "no active alarm")
	} else {
		tw := newTable(w)
		fmt.Fprintln(tw, "KIND\tSUBJECT\tVALUE\tTHRESHOLD\tSINCE\tMESSAGE")
		for _, e := range list.Active {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Kind, e.Subject, figure(e.Value), figure(e.Threshold),
				displayTime(e.Since), truncate(e.Message, 120))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(list.Recent) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nrecent events, the newest first:")
	tw := newTable(w)
	fmt.Fprintln(tw, "TIME\tSTATE\tKIND\tSUBJECT\tVALUE\tNODE")
	for _, e := range list.Recent {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", displayTime(e.Time), e.State, e.Kind, e.Subject, figure(e.Value), e.Node)
	}
	return tw.Flush()
}

func figure(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// fetch asks the server's HTTP API for its alarms.
func (o *alarmListOptions) fetch(cmd *cobra.Command) (alarm.List, error) {
	base := o.http
	if u, err := url.Parse(base); err != nil || u.Scheme == "" || u.Host == "" {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil {
		return alarm.List{}, fmt.Errorf("--http %q: %w", o.http, err)
	}
	u = u.JoinPath("/api/v1/alarms")
	u.RawQuery = url.Values{"recent": {strconv.Itoa(o.recent)}}.Encode()
	ctx := cmd.Context()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return alarm.List{}, fmt.Errorf("--http %q: %w", o.http, err)
	}
	if o.client.token != "" {
		req.Header.Set("Authorization", "Bearer "+o.client.token)
	}
	hc := &http.Client{Timeout: o.client.timeout}
	resp, err := hc.Do(req)
	if err != nil {
		return alarm.List{}, fmt.Errorf("ask %s for its alarms: %w", u.Host, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAlarmListBytes))
	if err != nil {
		return alarm.List{}, fmt.Errorf("read the alarms from %s: %w", u.Host, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return alarm.List{}, fmt.Errorf("%s has no alarms API: alarms are off there (alarms.enabled: false) or it is not a ferrymq server", u.Host)
	case resp.StatusCode == http.StatusUnauthorized:
		return alarm.List{}, errors.New("the server wants a token: --token or " + envToken)
	case resp.StatusCode != http.StatusOK:
		return alarm.List{}, fmt.Errorf("%s answered %s: %s", u.Host, resp.Status, truncate(string(body), 300))
	}
	var list alarm.List
	if err := json.Unmarshal(body, &list); err != nil {
		return alarm.List{}, fmt.Errorf("%s answered what is not an alarm list: %w", u.Host, err)
	}
	return list, nil
}
