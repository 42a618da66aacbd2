-- artifact://<id> (contract §4.3): `:edit artifact://<id>` shows an artifact's full text read-only;
-- `:edit artifact://<id>#L<a>-<b>` also jumps to line <a> and highlights the range (rescued
-- lines point there); truncated cards load it on demand. The backend only resolves the id to
-- the file (with the exact errors of contract §4.3); Neovim reads the file itself, so up to 32 MiB
-- of text never travels through RPC.

local M = {}
local H = {}

--- Resolves an artifact to its file. Returns true and the path, or false and the exact error
--- text of contract §4.3 (e.g. `Artifact 7 not found. Available: 1, 2`).
---@param id integer|string id or full `artifact://<id>` URL
---@return boolean ok
---@return string path_or_err
function M.path(id)
  local url = tostring(id)
  if not url:match('^artifact://') then
    url = 'artifact://' .. url
  end
  local ok, res = require('agent_bash.backend').request('artifact_path', { url = url })
  if ok and type(res) ~= 'string' then
    return false, ('unexpected answer to artifact_path: %s'):format(vim.inspect(res))
  end
  return ok, res
end

--- An artifact's lines, read from its file. Returns true and the lines, or false and the error.
---@param id integer|string id or full `artifact://<id>` URL
---@return boolean ok
---@return string[]|string lines_or_err
function M.lines(id)
  local ok, path = M.path(id)
  if not ok then
    return false, path
  end
  local rok, lines = pcall(vim.fn.readfile, path, 'b')
  if not rok then
    return false, ('could not read %s: %s'):format(path, lines)
  end
  if #lines > 0 and lines[#lines] == '' then
    lines[#lines] = nil -- the final newline makes no extra line
  end
  return true, lines
end

--- Splits text into buffer lines (a final newline does not make an extra empty line).
---@param text string
---@return string[]
function M.split(text)
  local lines = vim.split(text, '\n', { plain = true })
  if #lines > 1 and lines[#lines] == '' then
    lines[#lines] = nil
  end
  return lines
end

--- BufReadCmd handler for artifact://*: fills the buffer read-only from the artifact's file
--- (read by Neovim itself), or reports the error and leaves it empty.
---@param ev {buf: integer, match: string}
function M.read_cmd(ev)
  local buf = ev.buf
  local url, first, last = M.parse_range(ev.match)
  local ok, lines = M.lines(url)
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, ok and lines or {})
  H.options(buf)
  if not ok then
    -- One message line in the error colour: an error raised here would come with Neovim's
    -- autocommand trace and a hit-enter prompt.
    vim.api.nvim_echo({ { lines, 'ErrorMsg' } }, true, {})
    return
  end
  if first then
    H.show_range(buf, first, math.min(last, #lines), #lines)
  end
end

--- Splits `artifact://<id>#L<a>-<b>` (or `#L<a>`, `#L<a>-L<b>`) into the URL without the range
--- and the 1-based range; a URL without a range gives nil for both.
---@param name string
---@return string url
---@return integer? first
---@return integer? last
function M.parse_range(name)
  local url, a, b = name:match('^(.-)#L(%d+)%-L?(%d+)$')
  if not url then
    url, a = name:match('^(.-)#L(%d+)$')
    b = a
  end
  if not url then
    return name, nil, nil
  end
  return url, tonumber(a), tonumber(b)
end

-- Helpers -----------------------------------------------------------------------------------

H.ns = vim.api.nvim_create_namespace('agent_bash_artifact_range')

--- Puts the cursor on line {first} in the windows showing {buf} and highlights {first}..{last}.
function H.show_range(buf, first, last, count)
  if first > count or count == 0 then
    vim.notify(('Line %d is past the end of the artifact (%d lines)'):format(first, count), vim.log.levels.WARN)
    return
  end
  require('agent_bash.highlight').setup()
  vim.api.nvim_buf_clear_namespace(buf, H.ns, 0, -1)
  vim.api.nvim_buf_set_extmark(buf, H.ns, first - 1, 0, {
    end_row = math.max(first, last) - 1,
    end_col = 0,
    hl_group = 'AgentBashArtifactRange',
    hl_eol = true,
    line_hl_group = 'AgentBashArtifactRange',
  })
  local function jump(win)
    vim.api.nvim_win_set_cursor(win, { first, 0 })
  end
  local wins = vim.fn.win_findbuf(buf)
  for _, win in ipairs(wins) do
    jump(win)
  end
  -- BufReadCmd runs before the buffer is shown in a window on `:edit`: jump once it is.
  if #wins == 0 then
    vim.api.nvim_create_autocmd('BufWinEnter', {
      buffer = buf,
      once = true,
      callback = function()
        jump(0)
      end,
    })
  end
end

function H.options(buf)
  local bo = vim.bo[buf]
  bo.buftype = 'nofile'
  bo.swapfile = false
  bo.modified = false
  bo.modifiable = false
  bo.readonly = true
  bo.filetype = 'agent_bash_artifact'
end

return M
