---@meta
-- Shared shapes (LuaCATS only; this module has no runtime code).

---@alias agent_bash.Origin 'bang'|'tool'
---@alias agent_bash.Status 'running'|'done'|'error'|'cancelled'|'timed_out'|'failed'

--- One highlight span sent by the backend: 0-based row into `lines`, byte columns, SGR style.
---@class agent_bash.HlSpan
---@field [1] integer row (0-based)
---@field [2] integer start column (byte, 0-based)
---@field [3] integer end column (byte, exclusive)
---@field [4] agent_bash.Style

--- An SGR style; keys are absent when default.
---@class agent_bash.Style
---@field fg? integer|string 0-255 or '#rrggbb'
---@field bg? integer|string
---@field bold? boolean
---@field dim? boolean
---@field italic? boolean
---@field underline? boolean
---@field reverse? boolean
---@field strikethrough? boolean

---@class agent_bash.Truncation
---@field direction string
---@field truncated_by 'bytes'|'lines'
---@field shown_range {start: integer, end: integer}
---@field limit_bytes? integer window byte limit (default 51200 when absent)
---@field limit_lines? integer window line limit, named when `truncated_by` is 'lines'

--- A diagnostic of the part the window cut off (contract §7), with its artifact line number.
---@class agent_bash.Rescued
---@field line integer
---@field text string

---@class agent_bash.Blocked
---@field blocked boolean
---@field rule integer
---@field suggested_tool string
---@field message string

--- What the model gets (contract §7); snake_case as sent by the backend.
---@class agent_bash.BashResult
---@field artifact_path? string a mirrored call's artifact file (the MCP server's, contract §11)
---@field output string
---@field exit_code? integer
---@field cancelled boolean
---@field timed_out boolean
---@field truncated boolean
---@field total_lines integer
---@field total_bytes integer
---@field output_lines integer
---@field output_bytes integer
---@field artifact_id? integer
---@field duration_ms integer
---@field is_error boolean
---@field shell_restarted? boolean
---@field timeout_clamped_from? number
---@field blocked? agent_bash.Blocked
---@field remote? {profile: string, host?: string} where a remote profile ran it (contract §12)
---@field truncation? agent_bash.Truncation
---@field rescued? agent_bash.Rescued[] diagnostics the window cut off (contract §7)
---@field resources? {wall_ms: integer, cpu_user_ms?: integer, cpu_sys_ms?: integer, max_rss_kib?: integer} receipt (contract §7)
---@field changes? agent_bash.Change[] files the run changed (contract §13)
---@field changes_count? integer
---@field changes_id? integer
---@field changes_unavailable? string why there is no change receipt
---@field changes_indexing? string the project root whose first snapshot was being taken, when that is why (the editor's backend only)
---@field error? string set by Lua when the run could not start or the backend died

--- A live update, as passed to `on_update`.
---@class agent_bash.Update
---@field id integer
---@field lines string[] last ≤ 40 display lines
---@field hl agent_bash.HlSpan[]
---@field total_lines integer
---@field total_bytes integer
---@field elapsed_ms integer

--- Parameters of a tool call (contract §9).
---@class agent_bash.ToolParams
---@field command string
---@field timeout? number seconds
---@field cwd? string
---@field head? integer
---@field tail? integer
---@field tools? string[]
---@field session_key? string
---@field profile? string a remote profile of the backend's settings (contract §12); `local`: here

---@class agent_bash.ToolCallbacks
---@field on_update? fun(update: agent_bash.Update)
---@field on_done fun(result: agent_bash.BashResult)

--- Everything `card.lua` needs to draw one run.
---@class agent_bash.CardState
---@field origin agent_bash.Origin
---@field command string
---@field cwd_label? string cwd shown as `cd <label> && ` (nil when cwd is the project root)
---@field timeout? number seconds, when the call gave one
---@field exclude? boolean bang command excluded from context (drawn dimmed)
---@field status agent_bash.Status
---@field lines string[] display lines in hand
---@field hl agent_bash.HlSpan[]
---@field total_lines integer
---@field elapsed_ms? integer
---@field result? agent_bash.BashResult
---@field error? string why the run failed to start / died
---@field full_lines? string[] the artifact's text, once loaded
---@field cancel_requested? boolean
---@field client? string the MCP client that made the call (mirrored calls, contract §11)
---@field cwd? string where the command started on this machine (nil when elsewhere)
---@field profile? string the remote profile named at the start (the header's `host:` until the result says the host)
---@field started_at? integer vim.uv.now() when the run started (the title's elapsed time)
---@field waiting_input? boolean a PTY run's program waits for input (contract §8.4)
---@field receipts? agent_bash.ProjectStatus its project's receipts as last asked (a run whose first snapshot was being taken: `changes.follow`)

---@class agent_bash.CardOpts
---@field width integer text width of the window
---@field expanded boolean
---@field keys? agent_bash.Keys
---@field kill_key? string|false
---@field icons? table<agent_bash.Status, string>
---@field collapsed_lines? integer
---@field bang_lines? integer
---@field focused? boolean false: the cursor is not in the card (hints name commands, not its keys)
---@field id? integer the run's id, named by those commands

---@class agent_bash.CardHl
---@field [1] integer row (0-based)
---@field [2] integer start column (byte)
---@field [3] integer end column (byte, exclusive; -1 = end of line)
---@field [4] string highlight group

---@class agent_bash.Rendered
---@field lines string[]
---@field highlights agent_bash.CardHl[]
---@field styles table<string, agent_bash.Style> ANSI groups used, to be created lazily
---@field title [string, string][] chunks for the float title
---@field footer [string, string][] chunks for the float footer
---@field height integer display rows `lines` take at `width`
---@field expandable boolean toggling would show more (or less)
---@field can_load_full boolean truncated with an artifact not loaded yet
---@field width? integer set by float.lua: the width it was rendered for
---@field links table<integer, [integer, integer]> 0-based row → {artifact id, line} (rescued lines)

--- Session recording (contract §10), as the backend's `get_context` and `history` give it.
---@class agent_bash.ContextMessage
---@field role 'user'
---@field content string

---@class agent_bash.HistoryMeta
---@field cwd string
---@field timed_out boolean
---@field duration_ms integer
---@field total_lines integer
---@field total_bytes integer
---@field output_lines integer
---@field artifact_id? integer
---@field notice? string the truncation notice as the model sees it

--- One recorded bang command (`role = "bashExecution"`).
---@class agent_bash.HistoryEntry
---@field role string
---@field command string
---@field output string model-facing output, without annotations or notices
---@field exit_code? integer
---@field cancelled boolean
---@field truncated boolean
---@field meta agent_bash.HistoryMeta
---@field timestamp integer milliseconds since the Unix epoch
---@field exclude_from_context boolean

return {}
